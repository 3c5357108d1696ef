"""pmap and jit(shard_map) agree on a local pod of 2x4."""

import pytest

from runtime.workloads import mnist
from tests import helpers

pytestmark = pytest.mark.processes


@pytest.mark.timeout(240)
@pytest.mark.parametrize('workload', ['linear_regression', 'mnist'])
def test_pmap_and_shard_map_agree_on_2x4(tmp_path, workload):
  if workload == 'mnist':
    mnist.write_synthetic(str(tmp_path / 'data'), num_train=1024, num_test=1001)
    config_args = [
        '--config=configs/mnist.py', f'--config.data_dir={tmp_path}/data',
        '--config.model.hidden_sizes=(32,)', '--config.steps=16',
        '--config.eval_every=8', '--config.eval_batch_size=128'
    ]
  else:
    config_args = ['--config=configs/linear_regression.py', '--config.steps=40']
  summaries = {}
  for kind in ('pmap', 'shard_map'):
    workdir = tmp_path / kind
    result = helpers.run_launcher([
        *config_args, f'--config.parallelism={kind}', '--local_processes=2',
        '--local_devices=4', f'--workdir={workdir}'
    ],
                                  timeout=180)
    assert result.returncode == 0, result.output
    ranks = [
        helpers.read_json(workdir / 'ranks' / f'rank_{i}.json')
        for i in range(2)
    ]
    assert ranks[0]['fingerprint'] == ranks[1]['fingerprint']
    summaries[kind] = helpers.read_json(workdir / 'summary.json')
    assert summaries[kind]['device_count'] == 8
  by_pmap, by_shard_map = (
      summaries[k]['results'] for k in ('pmap', 'shard_map'))
  assert by_pmap['fingerprint'] == by_shard_map['fingerprint']
  assert by_pmap['eval'] == by_shard_map['eval']
