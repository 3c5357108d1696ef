"""A workload that chooses its exit code, in a local pod."""

import pytest

from tests import helpers

pytestmark = pytest.mark.processes


@pytest.mark.timeout(180)
def test_a_workload_chooses_its_exit_code_by_raising(tmp_path):
  result = helpers.run_launcher([
      f'--config={helpers.PROBE_CONFIG}', f'--workdir={tmp_path}',
      '--local_processes=2', '--config.steps=1000000', '--config.fail_rank=1',
      '--config.fail_mode=podrun_error', '--config.fail_code=42'
  ])
  assert result.returncode == 42, result.output
  assert 'rank 1/2 failed first, with exit code 42' in result.stderr
  assert 'probe: rank 1 chooses exit code 42' in result.stderr
  rank_0 = helpers.first_line_with(result.stderr, '[launcher] rank 0/2:')
  assert "a consequence of rank 1/2's failure, not a cause" in rank_0, rank_0
