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

What a run learned is kept in WORKDIR/stall/rank_<i>.json, so the next
attempt has its deadline from its first step.

K, MARGIN and FLOOR_S were chosen from measurements on a noisy 2-core
machine (BUILD_NOTES.md, issue 22): the largest interval between steps seen
in 20 runs with saves, evaluations and a recompile stayed well inside them.

Example:
  >>> limit, idle, why = stall.deadline(progress.snapshot(), 600, now)
"""

import json
import os
from typing import Optional

import numpy as np

from runtime.common import files
from runtime.common import progress

K = 10.0
MARGIN = 3.0
FLOOR_S = 10.0
WARMUP_STEPS = 20
DIRECTORY = 'stall'


def deadline(snapshot: progress.Snapshot, ceiling: float, now: float,
             learn: bool = True, floor_s: float = FLOOR_S
             ) -> Optional[tuple[float, float, str]]:
  """(limit s, idle s, what the limit is) after the first step; else None.

  Args:
    snapshot: this process's progress.
    ceiling: --stall_timeout; 0 disables the watchdog (None).
    now: time.monotonic().
    learn: False keeps the ceiling as the deadline.
    floor_s: no learned deadline is shorter (--stall_floor).
  """
  if not ceiling or snapshot.done_step is None:
    return None
  fixed = f'--stall_timeout={ceiling:g}'
  learned = snapshot.learned or progress.Learned()
  if snapshot.working is not None:
    idle = now - snapshot.working_since
    seen = learned.work_seconds.get(snapshot.working)
    if not learn or seen is None:
      return ceiling, idle, f'{snapshot.working}, {fixed}'
    limit = min(ceiling, max(floor_s, MARGIN * seen))
    return limit, idle, (f'{snapshot.working}, learned: {MARGIN:g} x the '
                         f'longest seen, {seen:.3g} s; ceiling {fixed}')
  idle = now - snapshot.idle_since
  steps = learned.step_seconds
  if not learn or len(steps) < WARMUP_STEPS:
    return ceiling, idle, fixed
  p99 = float(np.percentile(steps, 99))
  longest = max(learned.work_seconds.get('step', 0.0),
                learned.work_seconds.get('compile', 0.0))
  limit = min(ceiling, max(floor_s, K * p99, MARGIN * longest))
  return limit, idle, (f'learned: max({floor_s:g} s, {K:g} x p99 {p99:.3g} '
                       f's, {MARGIN:g} x longest {longest:.3g} s); ceiling '
                       f'{fixed}')


def path(workdir: str, process_index: int) -> str:
  return os.path.join(workdir, DIRECTORY, f'rank_{process_index}.json')


def load(workdir: str, process_index: int) -> Optional[progress.Learned]:
  """What an earlier attempt of this process learned, if anything."""
  try:
    with open(path(workdir, process_index)) as f:
      return progress.Learned.from_json(json.load(f))
  except (OSError, ValueError, TypeError, AttributeError):
    return None


def save(workdir: str, process_index: int,
         learned: Optional[progress.Learned]) -> None:
  if learned is None or not (learned.step_seconds or learned.work_seconds):
    return
  try:
    files.write_atomic(path(workdir, process_index),
                       json.dumps(learned.to_json()))
  except OSError:
    pass  # What it learned only saves time; never stop a job for it.
