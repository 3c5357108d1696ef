"""The local tier's cadence: in steps, or in seconds agreed on by every process."""

import threading

import pytest

from runtime.common import progress
from runtime.checkpoints import local_cadence
from tests import memory_job

pytestmark = pytest.mark.unit


def _copied(cadence, steps, blocking_s=0.0, start=1):
  """The steps `cadence` copies over `steps` steps from `start`."""
  out = []
  for count, step in enumerate(range(start, start + steps), 1):
    if cadence.due(step, count):
      out.append(step)
      cadence.saved(step, blocking_s)
  return out


def test_a_cadence_in_steps_copies_every_nth_step():
  assert _copied(local_cadence.Cadence(every_steps=25),
                 100) == [25, 50, 75, 100]
  assert not local_cadence.Cadence().enabled


def test_seconds_become_steps_after_the_warm_up():
  # 0.1 s steps, every 2 s: every 20 steps, the first decided at the end of
  # the warm-up (step 20).
  cadence = local_cadence.Cadence(every_s=2.0, step_s=lambda: 0.1)
  warm = progress.WARMUP_STEPS
  assert _copied(cadence, 100) == [warm + 20, warm + 40, warm + 60, warm + 80]
  # A resumed run counts its warm-up from its own first step.
  resumed = local_cadence.Cadence(every_s=2.0, step_s=lambda: 0.1)
  assert _copied(resumed, 50, start=501) == [500 + warm + 20]


def test_copies_in_seconds_block_the_loop_at_most_two_percent():
  # A copy that blocks 0.5 s needs 25 s between copies: 250 steps of 0.1 s,
  # although 2 s were asked for.
  assert local_cadence.steps_between(2.0, 0.1, 0.5) == 250
  cadence = local_cadence.Cadence(every_s=2.0, step_s=lambda: 0.1)
  copied = _copied(cadence, 1200, blocking_s=0.5)
  assert copied[1] - copied[0] == 250
  blocked = 0.5 * len(copied)
  trained = 0.1 * 1200
  assert blocked / trained <= local_cadence.BLOCKING_SHARE + 0.5 / trained


def test_every_process_copies_the_steps_process_0_chose():
  # The processes measure different step times; process 0's decide.
  store = memory_job.MemoryStore()
  times = [0.1, 0.13, 0.07]
  found = {}

  def play(index):
    cadence = local_cadence.Cadence(every_s=3.0,
                                    client=memory_job.MemoryJob(
                                        index, 3, store),
                                    step_s=lambda: times[index])
    found[index] = _copied(cadence, 150)

  threads = [threading.Thread(target=play, args=(i,)) for i in range(3)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(30)
  assert found[0] == found[1] == found[2] == [50, 80, 110, 140]


def test_a_slow_copy_in_steps_warns_once_and_keeps_the_steps(caplog):
  cadence = local_cadence.Cadence(every_steps=10, step_s=lambda: 0.1)
  with caplog.at_level('WARNING'):
    assert _copied(cadence, 40, blocking_s=0.5) == [10, 20, 30, 40]
  warned = [
      r.getMessage()
      for r in caplog.records
      if 'local copy blocks the loop' in r.getMessage()
  ]
  assert len(warned) == 1, warned
  assert 'local_checkpoint_every_s' in warned[0]


def test_the_default_copies_at_daly_s_interval():
  cadence = local_cadence.Cadence(every_steps=25,
                                  step_s=lambda: 0.1,
                                  budgeted=True)
  # 5 ms a copy, an hour between failures (the default), no restore yet:
  # sqrt(2 x 0.005 x 3600) - 0.005 = 6.0 s, 60 steps.
  assert _copied(cadence, 300, blocking_s=0.005) == [25, 85, 145, 205, 265]
  chosen = cadence.chosen
  assert round(chosen.seconds, 3) == 5.995 and chosen.mtbf_source == 'default'
  assert chosen.why.startswith("Daly's interval for a copy blocking 0.005 s")
  # A job that failed twice in 2 minutes: every 25 steps, the shortest.
  often = local_cadence.Cadence(every_steps=25,
                                step_s=lambda: 0.1,
                                budgeted=True)
  often.knows_fault_cost(3.0, 60.0, '2 hard failure(s) in 120 s of this job')
  assert _copied(often, 100, blocking_s=0.005) == [25, 50, 75, 100]


def test_the_interval_keeps_the_budget_and_the_ceiling():
  # Cheap copies: Daly's interval.
  assert local_cadence.interval(
      0.01, 5.0, 3600.0).seconds == pytest.approx((2 * 0.01 * 3605)**0.5 - 0.01)
  # A long mean between failures: the ceiling bounds what is recomputed.
  capped = local_cadence.interval(0.1, 5.0, 24 * 3600.0)
  assert capped.seconds == local_cadence.CEILING_S
  assert capped.why.startswith('the ceiling of 60 s')
  # A costly copy: the 2 % budget on the loop wins over both.
  costly = local_cadence.interval(1.5, 5.0, 3600.0)
  assert costly.seconds == 75.0 and costly.why.startswith('the 2 % budget')


def test_the_default_spaces_costly_copies_within_the_budget():
  # 0.92 s a copy, steps of 63 ms (the 136 M LM on a TPU v5e): Daly's
  # interval for an hour is 81 s, the ceiling 60 s (953 steps; 2 % needs
  # 46 s).
  cadence = local_cadence.Cadence(every_steps=25,
                                  step_s=lambda: 0.063,
                                  budgeted=True)
  copied = _copied(cadence, 2000, blocking_s=0.92)
  assert copied == [25, 978, 1931]
  blocked, trained = 0.92 * (len(copied) - 1), 0.063 * (copied[-1] - 25)
  assert blocked / trained <= local_cadence.BLOCKING_SHARE


def test_the_default_copies_at_the_first_call_past_its_step():
  # Four steps per call: the loop sees steps 4, 8, ...; 25 is copied at 28.
  cadence = local_cadence.Cadence(every_steps=25,
                                  step_s=lambda: 0.1,
                                  budgeted=True)
  copied = [
      step for count, step in enumerate(range(4, 104, 4), 1)
      if cadence.due(step, count) and cadence.saved(step, 0.0) is None
  ]
  assert copied == [28, 52, 76, 100]
