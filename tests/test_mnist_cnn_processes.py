"""The Flax CNN on a local pod: 2x4 matches 1x8."""

import pytest

from tests import helpers
from tests.test_mnist_cnn import data_dir  # pylint: disable=unused-import  (a fixture)

pytestmark = pytest.mark.processes


_SMALL = ['--config.model.features=(4, 8)', '--config.model.dense=16',
          '--config.optimizer.warmup_steps=3',
          '--config.optimizer.decay_steps=20', '--config.eval_batch_size=128']


@pytest.mark.timeout(240)
def test_2x4_matches_1x8(data_dir, tmp_path):
  args = ['--config=configs/mnist_cnn.py', f'--config.data_dir={data_dir}',
          '--config.steps=8', '--config.eval_every=4', *_SMALL]
  summaries = []
  for name, pod in (('1x8', []), ('2x4', ['--local_processes=2',
                                          '--local_devices=4'])):
    result = helpers.run_launcher([*args, *pod, f'--workdir={tmp_path / name}'],
                                  timeout=180)
    assert result.returncode == 0, result.output
    summaries.append(helpers.read_json(tmp_path / name / 'summary.json'))
  # Two processes really ran the second, one the first.
  assert [s['process_count'] for s in summaries] == [1, 2]
  assert [s['device_count'] for s in summaries] == [8, 8]
  one, two = (s['results'] for s in summaries)
  # gloo's cross-process all-reduce rounds differently from the in-process
  # one: equal to float32 precision, not bit for bit.
  for key in ('fingerprint', 'model_state_fingerprint'):
    assert one[key]['abs_sum'] == pytest.approx(two[key]['abs_sum'],
                                                rel=1e-5), key
  states = [helpers.final_state(tmp_path / name) for name in ('1x8', '2x4')]
  for part in ('params', 'model_state'):
    helpers.assert_trees_close(states[0][part], states[1][part], rtol=1e-4,
                               atol=1e-6)
  assert one['eval']['eval_loss'] == pytest.approx(two['eval']['eval_loss'],
                                                   rel=1e-4)
