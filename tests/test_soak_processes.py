"""The fault soak's smoke (tests/benchmarks/soak.py): four of its trials,
the kinds that failed before, each must recover exactly. The full soak is
a benchmark (BUILD_NOTES.md has its runs), not a test."""

import pytest

from tests.benchmarks import soak

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]


@pytest.mark.parametrize(
    'trial',
    [
        # Process 0 of the next attempt killed 0.3 s into its start-up, before
        # it opened its ledger: that attempt was missing from the record.
        soak.Trial(0,
                   'sigkill_start',
                   'fixed',
                   target=0,
                   at_step=12,
                   start_delay_s=0.3),
        # Process 0 stopped, its coordination service with it: a heartbeat to
        # it never returned, and the job waited for JAX's abort (134, 47 s).
        soak.Trial(1, 'sigstop', 'fixed', target=0, at_step=20),
        soak.Trial(2, 'preempt_pod', 'fixed', target=-1, at_step=15),
        # Process 1 killed at step 28, its copy of step 25 then truncated or
        # removed: the next attempt ended with exit 1 (BadZipFile).
        soak.Trial(3, 'damaged_local', 'fixed', target=1, at_step=28),
        # Sharded state, each process a replica: one lost and back, its
        # shards from a peer's local copy.
        soak.Trial(4, 'sigkill_step', 'sharded', target=2, at_step=20),
        # A SIGKILL inside a call of 5 steps.
        soak.Trial(5, 'sigkill_step', 'calls', target=1, at_step=23),
    ],
    ids=lambda t: f'{t.fault}-{t.mode}')
def test_a_trial_recovers_exactly(trial, tmp_path):
  """About 15-20 s each, 35 s for the stopped process 0
  (--heartbeat_timeout is 15 s): a census job on a local pod, its fault, its recovery (two
  attempts or three), then the census and what was left."""
  row = soak.run_trial(trial, tmp_path)
  assert row['success'], {k: v for k, v in row.items()}
  assert row['census_exact'] and not row['left_behind']
  assert row['attempts'] >= 2, row
