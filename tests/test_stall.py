"""The hang watchdog's learned deadline (launcher/process/stall.py)."""

import pytest

from launcher.process import stall
from runtime.common import progress
from runtime.common import layout

pytestmark = pytest.mark.unit


def _snapshot(steps, work=None, working=None, done_at=100.0, worked_until=None):
  return progress.Snapshot(done_step=len(steps) + 1,
                           done_at=done_at,
                           begun_step=None,
                           step_seconds=[],
                           own_seconds=[],
                           working=working,
                           working_since=None if working is None else 200.0,
                           worked_until=worked_until,
                           learned=progress.Learned(list(steps), dict(work or
                                                                      {})))


def test_the_warm_up_is_bounded_by_what_the_run_has_shown():
  # 19 fast steps and a 2 s first step: the floor.
  limit, idle, why = stall.deadline(_snapshot([0.025] *
                                              (progress.WARMUP_STEPS - 1)),
                                    600,
                                    now=130.0,
                                    first_step_s=2.0)
  assert (limit, idle) == (stall.FLOOR_S, 30.0) and why.startswith('warm-up')
  # A 40 s compilation, or a 50 s first step: 3 x that.
  slow = _snapshot([0.025] * 3, work={'compile': 40.0})
  assert stall.deadline(slow, 600, now=130.0)[0] == stall.MARGIN * 40.0
  assert stall.deadline(_snapshot([0.025]), 600, now=130.0,
                        first_step_s=50.0)[0] == stall.MARGIN * 50.0
  # Never above the ceiling.
  assert stall.deadline(slow, 60, now=130.0)[0] == 60


def test_after_the_warm_up_the_deadline_is_learned():
  limit, _, why = stall.deadline(_snapshot([0.025] * 100), 600, now=130.0)
  assert limit == stall.FLOOR_S and 'learned' in why
  slow = [2.0] * 100  # 10 x p99 = 20 s, above the floor.
  assert stall.deadline(_snapshot(slow), 600, now=130.0)[0] == 20.0
  # Never above the ceiling.
  assert stall.deadline(_snapshot(slow), 15, now=130.0)[0] == 15


def test_periodic_work_seen_between_steps_raises_the_deadline():
  seen = _snapshot([0.025] * 100, work={'step': 12.0, 'compile': 1.0})
  assert stall.deadline(seen, 600, now=130.0)[0] == stall.MARGIN * 12.0


def test_announced_work_gets_its_own_deadline():
  unseen = _snapshot([0.025] * 100, working='evaluation')
  limit, idle, why = stall.deadline(unseen, 600, now=230.0)
  assert (limit, idle) == (600, 30.0) and why.startswith('evaluation')
  seen = _snapshot([0.025] * 100,
                   work={'evaluation': 40.0},
                   working='evaluation')
  assert stall.deadline(seen, 600, now=230.0)[0] == stall.MARGIN * 40.0


def test_the_idle_time_counts_from_the_end_of_announced_work():
  after_eval = _snapshot([0.025] * 100, done_at=100.0, worked_until=125.0)
  assert stall.deadline(after_eval, 600, now=130.0)[1] == 5.0


def test_learning_can_be_turned_off_and_zero_disables():
  assert stall.deadline(_snapshot([0.025] * 100), 600, 130.0,
                        learn=False)[0] == 600
  assert stall.deadline(_snapshot([0.025] * 100), 0, 130.0) is None


def test_the_floor_is_a_flag():
  assert stall.deadline(_snapshot([0.025] * 100), 600, 130.0,
                        floor_s=2.0)[0] == 2.0


def test_what_was_learned_is_kept_and_used_from_the_next_first_step(tmp_path):
  for step in range(1, 31):
    progress.report(step, process_index=0)
  with progress.working('checkpoint'):
    pass
  stall.save(layout.Record(str(tmp_path)), 0, progress.snapshot().learned)
  progress.reset_for_tests()  # The next attempt: a new process.
  progress.seed(stall.load(layout.Record(str(tmp_path)), 0))
  progress.report(1, process_index=0)  # The next attempt's first step.
  snapshot = progress.snapshot()
  assert len(snapshot.learned.step_seconds) == 29
  assert 'checkpoint' in snapshot.learned.work_seconds
  _, _, why = stall.deadline(snapshot, 600, now=snapshot.done_at + 1)
  assert why.startswith('learned')


def test_a_missing_or_torn_file_teaches_nothing(tmp_path):
  assert stall.load(layout.Record(str(tmp_path)), 3) is None
  (tmp_path / 'stall').mkdir()
  (tmp_path / 'stall' / 'rank_3.json').write_text('{"step_sec')
  assert stall.load(layout.Record(str(tmp_path)), 3) is None
