"""A loss weighted by tokens (runtime.Weighted) trains across processes, and
through an elastic shrink from 2x4 to 1x4 (where each device runs two
passes), to the parameters one device reaches with the whole global batch
(tests/workloads/token_lm.py)."""

import numpy as np
import pytest

from tests import helpers
from tests.workloads import token_lm
from tests.workloads import token_lm_config

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

STEPS = 20
CONFIG = 'tests/workloads/token_lm_config.py'
ARGS = [
    f'--config={CONFIG}', f'--config.steps={STEPS}', '--config.log_every=1',
    '--config.checkpoint_every=10', '--config.local_checkpoint_every=2'
]


def _assert_trained_as_one_device(workdir):
  config = token_lm_config.get_config()
  want, _ = token_lm.one_device(config, STEPS)
  params = helpers.final_state(workdir)['params']
  for name in want:
    np.testing.assert_allclose(params[name], want[name], rtol=2e-5, atol=1e-6)


def test_on_2x4_and_through_a_shrink_to_1x4(tmp_path):
  """About 30 s: a 2x4 pod, then one that loses process 1 after step 7 and
  ends on 1x4."""
  pod = tmp_path / 'pod'
  result = helpers.run_launcher(
      [*ARGS, f'--workdir={pod}', '--local_processes=2', '--local_devices=4'],
      timeout=200)
  assert result.returncode == 0, result.output
  _assert_trained_as_one_device(pod)

  shrunk = tmp_path / 'shrunk'
  result = helpers.run_launcher([
      *ARGS, f'--workdir={shrunk}', '--local_processes=2', '--local_devices=4',
      '--min_processes=1', '--regrow_after=600', '--max_restarts=0',
      '--config.kill_rank=1', '--config.kill_step=7'
  ],
                                timeout=240)
  assert result.returncode == 0, result.output
  helpers.assert_no_survivors(shrunk)
  rows = helpers.read_jsonl(shrunk / 'metrics.jsonl')
  # The first attempt's groups of 4, on 4 devices: two passes each.
  assert {
      (r['num_processes'], r['num_devices'], r['microbatches']) for r in rows
  } == {(2, 8, 1), (1, 4, 2)}, rows
  _assert_trained_as_one_device(shrunk)
