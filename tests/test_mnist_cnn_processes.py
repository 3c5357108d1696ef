"""The Flax CNN (BatchNorm and dropout) on local pods: 2x4 and 3x2 match
1x8, trained once for both (the CNN is the slowest model on XLA:CPU)."""

import pytest

from tests import helpers
from tests.test_mnist_cnn import data_dir  # pylint: disable=unused-import  (a fixture)

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

# Groups of 8 examples (config.microbatch_size): 1 pass a device on 8
# devices, 2 on 6 (with 4 groups of padding), so BatchNorm's statistics are
# over the same groups on every topology; dropout's masks are per example.
_ARGS = [
    '--config=configs/mnist_cnn.py', '--config.steps=6',
    '--config.eval_every=3', '--config.model.features=(4, 8)',
    '--config.model.dense=16', '--config.optimizer.warmup_steps=2',
    '--config.optimizer.decay_steps=10', '--config.eval_batch_size=128',
    '--config.global_batch_size=64', '--config.microbatch_size=8',
    '--config.checkpoint_every=0'
]


def _run(data_dir, workdir, *topology):
  result = helpers.run_launcher([
      *_ARGS, f'--config.data_dir={data_dir}', *topology, f'--workdir={workdir}'
  ],
                                timeout=200)
  assert result.returncode == 0, result.output
  return result


@pytest.fixture(scope='module')
def one_by_eight(data_dir, tmp_path_factory):
  """The CNN on 1 process x 8 devices (pmap)."""
  workdir = tmp_path_factory.mktemp('cnn_1x8')
  _run(data_dir, workdir, '--local_devices=8')
  return workdir


def _assert_same_model(one, other, rtol):
  states = [helpers.final_state(w) for w in (one, other)]
  for part in ('params', 'model_state'):
    helpers.assert_trees_close(states[0][part],
                               states[1][part],
                               rtol=rtol,
                               atol=rtol / 100)


def test_2x4_matches_1x8(data_dir, tmp_path, one_by_eight):
  """About 20-40 s: two processes compile the CNN's step (BatchNorm, Adam)
  and its evaluation."""
  _run(data_dir, tmp_path, '--local_processes=2', '--local_devices=4')
  summaries = [
      helpers.read_json(w / 'summary.json') for w in (one_by_eight, tmp_path)
  ]
  # Two processes really ran the second, one the first.
  assert [s['process_count'] for s in summaries] == [1, 2]
  assert [s['device_count'] for s in summaries] == [8, 8]
  one, two = (s['results'] for s in summaries)
  # gloo's cross-process all-reduce rounds differently from the in-process
  # one: equal to float32 precision, not bit for bit.
  for key in ('fingerprint', 'model_state_fingerprint'):
    assert one[key]['abs_sum'] == pytest.approx(two[key]['abs_sum'],
                                                rel=1e-5), key
  _assert_same_model(one_by_eight, tmp_path, rtol=1e-4)
  assert one['eval']['eval_loss'] == pytest.approx(two['eval']['eval_loss'],
                                                   rel=1e-4)


def test_3x2_in_microbatches_with_padding_matches_1x8(data_dir, tmp_path,
                                                      one_by_eight):
  """3 x 2 devices as jit(shard_map): 2 microbatches of 8 a device and 4
  of 12 groups padding compute the step of 1 x 8. Over 30 s on a loaded
  machine: the CNN's scan over microbatches is slow on XLA:CPU
  (BUILD_NOTES, issue 30)."""
  result = _run(data_dir, tmp_path, '--local_processes=3', '--local_devices=2',
                '--config.parallelism=shard_map')
  assert ('2 microbatch(es) of 8 example(s) per device, 4 of 12 group(s) '
          'padding') in result.stderr, result.stderr
  _assert_same_model(one_by_eight, tmp_path, rtol=2e-4)
