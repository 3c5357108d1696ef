"""The step line's rates give the loop's pace on its steps, not its pauses
(issue 85): on a TPU v5e the linear regression's lines alternated 12917.8
and 103.3 steps/s, the slow ones timing a compile (a new steps-per-call
size) as steps."""

import json

import pytest

from tests import helpers

pytestmark = pytest.mark.processes


def test_lines_that_hold_a_compile_or_a_save_give_the_others_pace(tmp_path):
  """A job through the launcher (which counts compiles into the goodput
  ledger) of a tiny step, 20 a call: every other window of 200 steps holds
  a synchronous checkpoint save, and one of each two a compile of 150
  fused ops. The steady-state lines differ by less than 2x."""
  workdir = tmp_path / 'w'
  result = helpers.run_launcher([
      '--config=configs/linear_regression.py', f'--workdir={workdir}',
      '--local_devices=8',
      '--config.workload=tests.workloads.paused:train_and_evaluate',
      '--config.steps=1200', '--config.log_every=200',
      '--config.steps_per_dispatch=20', '--config.checkpoint_every=400',
      '--config.async_checkpointing=false'
  ],
                                timeout=240)
  assert result.returncode == 0, result.output[-3000:]
  with open(workdir / 'metrics.jsonl') as f:
    rates = [json.loads(line)['steps_per_sec'] for line in f]
  steady = rates[1:]  # The first window holds the run's first calls.
  assert len(steady) == 5 and max(steady) < 2 * min(steady), rates
