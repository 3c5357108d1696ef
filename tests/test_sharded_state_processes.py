"""config.state_layout='sharded' on local pods: MNIST's MLP with Adam
trains as the replicated state does, to float rounding, on 2x4, 4x2 (with
2 microbatches) and 1x8."""

import jax
import numpy as np
import pytest

from runtime.workloads import mnist
from tests import helpers

pytestmark = pytest.mark.processes


def _run(tmp_path, name: str, layout: str, processes: int, devices: int,
         *extra: str) -> tuple[dict, str]:
  workdir = tmp_path / name
  result = helpers.run_launcher(
      ['--config=configs/mnist.py', f'--config.data_dir={tmp_path}/data',
       '--config.model.hidden_sizes=(64,)', '--config.steps=20',
       '--config.global_batch_size=64', '--config.parallelism=shard_map',
       f'--config.state_layout={layout}', f'--local_processes={processes}',
       f'--local_devices={devices}', f'--workdir={workdir}', *extra],
      timeout=180)
  assert result.returncode == 0, result.output
  return helpers.final_state(workdir), result.output


@pytest.mark.timeout(400)
def test_the_sharded_state_trains_as_the_replicated_one(tmp_path):
  """About 50 s: five pods (replicated 2x4, then sharded 2x4, 4x2, 1x8 and
  2x4 as one replica), each a few seconds of start-up; the comparison is
  the point."""
  mnist.write_synthetic(str(tmp_path / 'data'), num_train=1024, num_test=64)
  want, _ = _run(tmp_path, 'replicated', 'replicated', 2, 4)
  for name, processes, devices, extra, said in (
      ('2x4', 2, 4, (), '2 replica(s) (one per process) of 4 device(s)'),
      ('4x2', 4, 2, ('--config.microbatches=2',),
       '4 replica(s) (one per process) of 2 device(s)'),
      ('1x8', 1, 8, (), '1 replica(s) (one per process) of 8 device(s)'),
      # One replica across both processes: the host copies are gathered.
      ('2x4-all', 2, 4, ('--config.replica=all',),
       '1 replica(s) (every device) of 8 device(s)')):
    got, output = _run(tmp_path, name, 'sharded', processes, devices, *extra)
    assert f'state sharded: {said}' in output, output
    helpers.assert_trees_close(got['params'], want['params'], rtol=1e-5,
                               atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(got['opt_state']),
                    jax.tree_util.tree_leaves(want['opt_state']), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert np.array_equal(got['rng'], want['rng'])


@pytest.mark.timeout(60)
def test_sharded_state_under_pmap_is_refused_naming_shard_map(tmp_path):
  result = helpers.run_launcher(
      ['--config=configs/linear_regression.py', '--config.steps=2',
       '--config.state_layout=sharded', '--local_processes=1',
       '--local_devices=2', f'--workdir={tmp_path}'], timeout=50)
  assert result.returncode != 0
  assert "set config.parallelism='shard_map'" in result.output, result.output
