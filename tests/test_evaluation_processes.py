"""Exact evaluation on a local pod: 2x4 scores what 1x8 does."""

import pytest

from runtime.workloads import mnist

pytestmark = pytest.mark.processes


@pytest.mark.timeout(180)
def test_mnist_on_2x4_matches_1x8(tmp_path):
  from tests import helpers  # pylint: disable=g-import-not-at-top
  mnist.write_synthetic(str(tmp_path / 'data'), num_train=2048, num_test=1001)
  args = [
      '--config=configs/mnist.py', f'--config.data_dir={tmp_path}/data',
      '--config.model.hidden_sizes=(32,)', '--config.steps=20',
      '--config.eval_every=10', '--config.eval_batch_size=128'
  ]
  summaries = []
  for name, pod in (('1x8', []),
                    ('2x4', ['--local_processes=2', '--local_devices=4'])):
    result = helpers.run_launcher([*args, *pod, f'--workdir={tmp_path / name}'])
    assert result.returncode == 0, result.output
    summaries.append(helpers.read_json(tmp_path / name / 'summary.json'))
  # Two processes really ran the second, one the first.
  assert [s['process_count'] for s in summaries] == [1, 2]
  assert [s['device_count'] for s in summaries] == [8, 8]
  one, two = (s['results'] for s in summaries)
  # gloo's cross-process all-reduce of these larger gradients rounds
  # differently from the in-process one: equal to float32 precision, not bit
  # for bit.
  assert one['fingerprint']['abs_sum'] == pytest.approx(
      two['fingerprint']['abs_sum'], rel=1e-6)
  helpers.assert_trees_close(helpers.final_state(tmp_path / '1x8')['params'],
                             helpers.final_state(tmp_path / '2x4')['params'],
                             rtol=1e-4,
                             atol=1e-6)
  assert one['eval']['eval_num_examples'] == two['eval'][
      'eval_num_examples'] == 1001
  assert abs(one['eval']['eval_accuracy'] -
             two['eval']['eval_accuracy']) <= 2 / 1001
  assert one['eval']['eval_loss'] == pytest.approx(two['eval']['eval_loss'],
                                                   rel=1e-4)
