"""A grain MapDataset with a random_map as the probe's data (the census
counting every example trained), on pods of processes: exact through a
SIGKILL on a 2x4 local pod, and through a resume from 1x8 onto 2x4. The
elastic shrink and growth with the same data is
tests/test_elastic_processes.py's grain case.
"""

import pytest

from tests import helpers
from tests.workloads import census

pytest.importorskip('grain')

pytestmark = [pytest.mark.processes, pytest.mark.timeout(400)]

STEPS, BATCH, EXAMPLES = 60, 40, 400
PROBE = [
    f'--config={helpers.PROBE_CONFIG}', f'--config.steps={STEPS}',
    f'--config.global_batch_size={BATCH}',
    f'--config.data.num_examples={EXAMPLES}', '--config.data.grain=True',
    '--config.census=True', '--config.log_every=10',
    '--config.local_checkpoint_every=10', '--config.checkpoint_every=30'
]


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
  """One process x 8 devices, never interrupted."""
  workdir = tmp_path_factory.mktemp('straight')
  result = helpers.run_launcher([*PROBE, f'--workdir={workdir}'], timeout=200)
  assert result.returncode == 0, result.output
  return helpers.final_state(workdir)['params']


def _assert_as_straight(workdir, straight) -> None:
  params = helpers.final_state(workdir)['params']
  census.assert_exactly_once(params, straight, BATCH, EXAMPLES, STEPS)
  helpers.assert_trees_close(params, straight, rtol=1e-5, atol=1e-6)


def test_a_sigkilled_2x4_pod_with_grain_data_resumes_exactly(
    tmp_path, straight):
  workdir = tmp_path / 'killed'
  result = helpers.run_launcher([
      *PROBE, f'--workdir={workdir}', '--local_processes=2',
      '--local_devices=4', '--max_restarts=1', '--retry_exit_codes=137',
      '--restart_backoff=0.5', '--config.fail_rank=1', '--config.fail_step=25',
      '--config.fail_mode=sigkill', '--config.fail_once=True'
  ],
                                timeout=300)
  assert result.returncode == 0, result.output
  helpers.assert_no_survivors(workdir)
  assert 'job ended with exit code 0 after 1 restart(s)' in result.stderr, (
      result.stderr)
  _assert_as_straight(workdir, straight)


def test_a_grain_run_resumed_from_1x8_onto_2x4_is_exact(tmp_path, straight):
  workdir = tmp_path / 'moved'
  first = helpers.run_launcher(
      [*PROBE, f'--workdir={workdir}', '--config.steps=30'], timeout=200)
  assert first.returncode == 0, first.output
  second = helpers.run_launcher([
      *PROBE, f'--workdir={workdir}', '--local_processes=2', '--local_devices=4'
  ],
                                timeout=300)
  assert second.returncode == 0, second.output
  assert 'resum' in second.output and '30' in second.output
  _assert_as_straight(workdir, straight)
