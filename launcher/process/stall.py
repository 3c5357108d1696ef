"""The hang watchdog's deadline, learned from the run's own pace.

A fixed --stall_timeout must allow for the slowest thing a job ever does
between two steps, so a job whose steps take 25 ms waits 600 s to learn that
one of its processes is wedged. Instead, once it has seen WARMUP_STEPS
steps, the deadline for "no step completed" is

  max(FLOOR_S (--stall_floor), K x the p99 interval between completed steps,
      MARGIN x the longest interval it has seen, MARGIN x the longest
      compilation it has seen),

and while the loop announces periodic work (runtime.progress.working: a
save, an evaluation), MARGIN x the longest work of that kind seen so far,
or the ceiling the first time. --stall_timeout stays the ceiling of every
deadline, and with --nolearned_stall_deadline the deadline itself. In a job
of several processes the floor is at least --heartbeat_timeout + 2 s, so
that a process that died is named lost (exit 10) before its peers' steps
are taken for stalled.

Before WARMUP_STEPS, during the warm-up, the deadline is bounded by what
the run has shown so far:

  max(FLOOR_S, MARGIN x the longest of: the time to the first step (start-up
      and compilation), any interval between steps, any compilation),

so that a hang in the first steps (a data reader, a first bucket read, a
collective stuck after start-up) is named within seconds of the floor, not
after the ceiling.

What a run learned is kept in WORKDIR/stall/rank_<i>.json, so the next
attempt has its deadline from its first step.

K, MARGIN and FLOOR_S were chosen from measurements on a noisy 2-core
machine (BUILD_NOTES.md, issue 22): the largest interval between steps seen
in 20 runs with saves, evaluations and a recompile stayed well inside them.

Example:
  >>> limit, idle, why = stall.deadline(progress.snapshot(), 600, now)
"""

import json
import time
from typing import Optional

import numpy as np

from launcher.common import process_flags
from runtime.common import files
from runtime.common import layout
from runtime.common import progress
from runtime.common import records

K = 10.0
MARGIN = 3.0
FLOOR_S = process_flags.WatchFlags.stall_floor  # --stall_floor's default
_SAVE_EVERY_S = 30.0


def deadline(snapshot: progress.Snapshot,
             ceiling: float,
             now: float,
             learn: bool = True,
             floor_s: float = FLOOR_S,
             first_step_s: float = 0.0) -> Optional[tuple[float, float, str]]:
  """(limit s, idle s, what the limit is) after the first step; else None.

  Args:
    snapshot: this process's progress.
    ceiling: --stall_timeout; 0 disables the watchdog (None).
    now: time.monotonic().
    learn: False keeps the ceiling as the deadline.
    floor_s: no learned deadline is shorter (--stall_floor).
    first_step_s: how long the first step took from the start of
      supervision, for the warm-up's bound.
  """
  if not ceiling or snapshot.done_step is None:
    return None
  fixed = f'--stall_timeout={ceiling:g}'
  learned = snapshot.learned or progress.Learned()
  if snapshot.working is not None:
    # A snapshot names work with its start.
    assert snapshot.working_since is not None
    idle = now - snapshot.working_since
    seen = learned.work_seconds.get(snapshot.working)
    if not learn or seen is None:
      return ceiling, idle, f'{snapshot.working}, {fixed}'
    limit = min(ceiling, max(floor_s, MARGIN * seen))
    return limit, idle, (f'{snapshot.working}, learned: {MARGIN:g} x the '
                         f'longest seen, {seen:.3g} s; ceiling {fixed}')
  # A step is done (tested above): idle since it, or since work after it.
  assert snapshot.idle_since is not None
  idle = now - snapshot.idle_since
  steps = learned.step_seconds
  if not learn:
    return ceiling, idle, fixed
  longest = max(learned.work_seconds.get('step', 0.0),
                learned.work_seconds.get('compile', 0.0))
  if len(steps) < progress.WARMUP_STEPS:
    seen = max(longest, first_step_s)
    limit = min(ceiling, max(floor_s, MARGIN * seen))
    return limit, idle, (
        f'warm-up, {len(steps)} of {progress.WARMUP_STEPS} steps '
        f'seen: max({floor_s:g} s, {MARGIN:g} x the longest '
        f'of the first step, a step or a compilation, '
        f'{seen:.3g} s); ceiling {fixed}')
  p99 = float(np.percentile(steps, 99))
  limit = min(ceiling, max(floor_s, K * p99, MARGIN * longest))
  return limit, idle, (f'learned: max({floor_s:g} s, {K:g} x p99 {p99:.3g} '
                       f's, {MARGIN:g} x longest {longest:.3g} s); ceiling '
                       f'{fixed}')


def path(record: layout.Record, process_index: int) -> str:
  return record.stall(process_index)


def load(record: layout.Record,
         process_index: int) -> Optional[progress.Learned]:
  """What an earlier attempt of this process learned, if anything."""
  try:
    with open(path(record, process_index)) as f:
      return progress.Learned.from_json(json.load(f))
  except (OSError, ValueError, TypeError, AttributeError):
    return None


def save(record: layout.Record, process_index: int,
         learned: Optional[progress.Learned]) -> None:
  if learned is None or not (learned.step_seconds or learned.work_seconds):
    return
  try:
    files.write_atomic(path(record, process_index),
                       json.dumps(learned.to_json()))
  except OSError:
    pass  # What it learned only saves time; never stop a job for it.


class StallWatch:
  """One process's hang watchdog: the first-step limit, then the deadline
  above, with what it learns kept for the next attempt.

  Example:
    >>> watch = StallWatch(process_index=0, host='h', stall_timeout=600,
    ...                    first_step_timeout=1800, floor_s=10)
    >>> watch.learn_in(record)
    >>> cause = watch.check(progress.snapshot(), time.monotonic())
  """

  def __init__(self,
               process_index: int,
               host: str,
               stall_timeout: float,
               first_step_timeout: float,
               floor_s: float = FLOOR_S,
               learn: bool = True):
    self.process_index, self.host = process_index, host
    self.stall_timeout, self.first_step_timeout = (stall_timeout,
                                                   first_step_timeout)
    self.floor_s, self.learn = floor_s, learn
    self.started_at = time.monotonic()
    self.first_step_s: Optional[float] = None
    # Where the learned pace is kept (WORKDIR/stall), once it is known.
    self.record: Optional[layout.Record] = None
    self._saved_at = time.monotonic()

  def learn_in(self, record: layout.Record) -> None:
    """Starts from what an earlier attempt learned of this process's pace,
    and keeps what this one learns, in WORKDIR/stall."""
    self.record = record
    learned = load(record, self.process_index)
    if learned is not None:
      progress.seed(learned)

  def check(self, snapshot: progress.Snapshot,
            now: float) -> Optional[records.Fault]:
    """A 'stalled' cause when this process is past its deadline, else None."""
    if snapshot.done_step is None:
      waited = now - self.started_at
      limit = self.first_step_timeout
      if 0 < limit < waited:
        return records.Fault(
            'stalled',
            self.process_index,
            self.host,
            summary=(
                f'no first step completed within {limit:g} s '
                '(--first_step_timeout); a workload that runs a loop of its '
                'own must report each step with runtime.progress.report(step)'))
      return None
    assert snapshot.done_at is not None  # A done step has its time.
    if self.first_step_s is None:  # At most a second late: a bound above.
      self.first_step_s = max(0.0, snapshot.done_at - self.started_at)
    self.keep(snapshot, now)
    found = deadline(snapshot, self.stall_timeout, now, self.learn,
                     self.floor_s, self.first_step_s)
    if found is None or found[1] <= found[0]:
      return None
    limit, idle, why = found
    doing = (f' while {snapshot.working}' if snapshot.working else '')
    if snapshot.working and snapshot.working_on:
      doing += f' ({snapshot.working_on})'
    return records.Fault(
        'stalled',
        self.process_index,
        self.host,
        summary=(
            f'no step completed for {idle:.0f} s after step '
            f'{snapshot.done_step}{doing} (deadline {limit:.3g} s: {why})'),
        at=time.time() - idle)

  def keep(self,
           snapshot: progress.Snapshot,
           now: float,
           force: bool = False) -> None:
    """Writes what this process learned of its pace, every 30 s."""
    if self.record is None:
      return
    if force or now - self._saved_at > _SAVE_EVERY_S:
      self._saved_at = now
      save(self.record, self.process_index, snapshot.learned)
