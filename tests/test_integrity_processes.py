"""A bit flipped on one device of one process stops a real job, named."""

import pytest

from runtime.common import exit_codes
from tests import helpers

pytestmark = pytest.mark.processes


@pytest.mark.timeout(180)
@pytest.mark.parametrize('parallelism_name', ['pmap', 'shard_map'])
def test_a_bit_flipped_on_one_device_of_one_process_stops_the_job(
    tmp_path, parallelism_name):
  result = helpers.run_launcher([
      f'--config={helpers.PROBE_CONFIG}', f'--workdir={tmp_path}',
      '--local_processes=2', '--config.steps=1000000',
      '--config.checkpoint_every=10', '--config.integrity_every=10',
      f'--config.parallelism={parallelism_name}', '--config.flip_rank=1',
      '--config.flip_step=25', '--config.flip_device=2'
  ])
  assert result.returncode == exit_codes.REPLICAS_DIVERGED, result.output
  message = helpers.first_line_with(result.stderr, 'replicas diverged')
  assert 'the replicas diverged by step 30 (they agreed at step 20)' in (
      message), message
  assert "rank 1 device 2: first differs at params['bias']" in message
  assert 'the newest checkpoint saved before is step 20' in message
  assert helpers.wait_for(lambda: not helpers.job_processes(tmp_path), 10)


@pytest.mark.timeout(180)
def test_a_bit_flipped_in_one_shard_of_a_sharded_state_is_named(tmp_path):
  """Four replicas of 2 devices: the ballast's part on process 1's device 1
  (shard 1 of 2) against the same part in the three other replicas."""
  result = helpers.run_launcher([
      f'--config={helpers.PROBE_CONFIG}', f'--workdir={tmp_path}',
      '--local_processes=4', '--local_devices=2', '--config.steps=1000000',
      '--config.checkpoint_every=10', '--config.integrity_every=10',
      '--config.parallelism=shard_map', '--config.state_layout=sharded',
      '--config.ballast_floats=4096', '--config.flip_rank=1',
      '--config.flip_step=25', '--config.flip_device=1'
  ])
  assert result.returncode == exit_codes.REPLICAS_DIVERGED, result.output
  message = helpers.first_line_with(result.stderr, 'replicas diverged')
  assert 'the replicas diverged by step 30 (they agreed at step 20)' in (
      message), message
  assert ("rank 1 device 1 (shard 1 of 2): first differs at "
          "params['ballast'].") in message, message
  assert message.count('first differs') == 1, message
  assert helpers.wait_for(lambda: not helpers.job_processes(tmp_path), 10)
