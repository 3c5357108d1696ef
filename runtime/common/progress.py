"""How far this process has got: the one call a training loop makes per step.

`report(step)` says that `step` is complete here. Every rank's supervisor
(launcher/process/supervisor.py) reads it for its hang watchdog, its straggler
check and summary.json; a local-pod launcher also gets it through the pipe in
PODRUN_PROGRESS_FD. `runtime.train` calls it; a workload that runs a loop of
its own must call it once per step too, or the watchdog takes the job for
stalled after --first_step_timeout.

Example (a loop of one's own):
  >>> for step in range(1, steps + 1):
  ...   state = my_step(state, batch)
  ...   progress.report(step)
"""

import collections
import contextlib
import dataclasses
import os
import threading
import time
from typing import Iterator, Optional

import numpy as np

from runtime.common import handoff

_MIN_INTERVAL_S = 1.0
_RECENT_STEPS = 100
_LEARNED_STEPS = 1000
# The first steps of a process (compilation, caches filling, a prefetcher
# starting) say nothing of its pace: the stall watchdog learns no deadline
# from them, and a process's own time per step is recorded only after them.
WARMUP_STEPS = 20


@dataclasses.dataclass
class Snapshot:
  """What this process has done, as of one moment.

  Attributes:
    done_step: the last step reported complete, or None before the first.
    done_at: time.monotonic() of that report.
    begun_step: the last step this process started (it had its batch and
      dispatched the step), or None.
    step_seconds: recent intervals between completed steps.
    own_seconds: recent per-step time this process spent on its own before
      it could start a step (waiting for its input, dispatching), i.e. the
      part of a step that peers wait for when this process is slow; none
      of its first WARMUP_STEPS steps.
  """
  done_step: Optional[int]
  done_at: Optional[float]
  begun_step: Optional[int]
  step_seconds: list[float]
  own_seconds: list[float]
  working: Optional[str] = None
  working_since: Optional[float] = None
  worked_until: Optional[float] = None
  learned: Optional['Learned'] = None
  working_on: str = ''

  @property
  def idle_since(self) -> Optional[float]:
    """When this process last completed a step or finished announced work."""
    marks = [t for t in (self.done_at, self.worked_until) if t is not None]
    return max(marks) if marks else None


@dataclasses.dataclass
class Learned:
  """What a run has taught about its own pace (the stall deadline's input).

  Attributes:
    step_seconds: intervals between completed steps, work announced with
      `working` left out; the newest _LEARNED_STEPS.
    work_seconds: the longest of each kind of announced work, and of a
      compilation ('compile').
  """
  step_seconds: list[float] = dataclasses.field(default_factory=list)
  work_seconds: dict[str, float] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    return {
        'step_seconds': self.step_seconds,
        'work_seconds': self.work_seconds
    }

  @classmethod
  def from_json(cls, value: dict) -> 'Learned':
    return cls([float(x) for x in value.get('step_seconds', [])], {
        k: float(v) for k, v in value.get('work_seconds', {}).items()
    })


class _Progress:

  def __init__(self):
    self.lock = threading.Lock()
    self.done_step = self.done_at = self.begun_step = None
    self.step_seconds = collections.deque(maxlen=_RECENT_STEPS)
    self.own_seconds = collections.deque(maxlen=_RECENT_STEPS)
    self.begun_count = 0
    self.fd = handoff.current().progress_fd
    self.last_write = None
    self.working = self.working_since = self.worked_until = None
    self.working_on = ''
    self.learned_steps = collections.deque(maxlen=_LEARNED_STEPS)
    self.work_seconds: dict[str, float] = {}

  def report(self, step: int, process_index: Optional[int],
             force: bool) -> None:
    now = time.monotonic()
    with self.lock:
      if self.done_at is not None and step > (self.done_step or 0):
        self.step_seconds.append((now - self.done_at) / (step - self.done_step))
        since = max(self.done_at, self.worked_until or self.done_at)
        interval = (now - since) / (step - self.done_step)
        self.learned_steps.append(interval)
        self.took('step', interval)
      self.done_step, self.done_at = step, now
    self._write_pipe(step, process_index, force, now)

  def start_work(self, kind: str, on: str = '') -> None:
    with self.lock:
      self.working, self.working_since = kind, time.monotonic()
      self.working_on = on

  def end_work(self) -> None:
    now = time.monotonic()
    with self.lock:
      if self.working is None:
        return
      self.took(self.working, now - self.working_since)
      self.working, self.worked_until = None, now

  def took(self, kind: str, seconds: float) -> None:
    """Keeps the longest `seconds` of `kind`; the caller holds the lock."""
    self.work_seconds[kind] = max(self.work_seconds.get(kind, 0.0), seconds)

  def _write_pipe(self, step: int, process_index: Optional[int], force: bool,
                  now: float) -> None:
    if self.fd is None:
      return
    if (not force and self.last_write is not None and
        now - self.last_write < _MIN_INTERVAL_S):
      return
    self.last_write = now
    if process_index is None:
      import jax  # pylint: disable=g-import-not-at-top
      process_index = jax.process_index()
    try:
      # One write below PIPE_BUF is atomic, so ranks may share the pipe.
      os.write(self.fd, f'{process_index} {step}\n'.encode())
    except OSError:
      self.fd = None  # The supervisor is gone; keep training.

  def begin(self, step: int, own_seconds: float) -> None:
    with self.lock:
      self.begun_count += 1
      if self.begun_count > WARMUP_STEPS:
        self.own_seconds.append(own_seconds)
      self.begun_step = step

  def snapshot(self) -> Snapshot:
    with self.lock:
      return Snapshot(
          self.done_step,
          self.done_at, self.begun_step, list(self.step_seconds),
          list(self.own_seconds), self.working, self.working_since,
          self.worked_until,
          Learned(list(self.learned_steps),
                  dict(self.work_seconds)), self.working_on)


_progress = _Progress()


def report(step: int,
           process_index: Optional[int] = None,
           force: bool = False) -> None:
  """Reports that `step` (counted from 1) is complete on this process.

  Cheap enough for every step: the supervisor reads it from memory, and the
  local-pod pipe gets at most one write a second unless `force` is set (for
  the last step, so that the watchdog's clock stops where the work stops).

  Args:
    step: the number of the step just completed; steps only go up.
    process_index: this process; read from JAX when not given.
    force: write to the local-pod pipe even within the second.

  Example:
    >>> progress.report(step)
  """
  _progress.report(step, process_index, force)


def begin(step: int, own_seconds: float = 0.0) -> None:
  """Says that this process has started `step`, after `own_seconds` of its own
  work (input wait, dispatch). Optional: it lets a hang or a straggler be
  pinned on the process that others wait for."""
  _progress.begin(step, own_seconds)


@contextlib.contextmanager
def working(kind: str, on: str = '') -> Iterator[None]:
  """Announces periodic work between steps (a save, an evaluation), so that
  the hang watchdog allows for it: the longest of each kind it has seen, or
  its ceiling the first time (launcher/process/stall.py). `on` says what it
  works on (a checkpoint's path), for the watchdog's message.

  Example:
    >>> with progress.working('evaluation'):
    ...   values = evaluate(params)
  """
  _progress.start_work(kind, on)
  try:
    yield
  finally:
    _progress.end_work()


def took(kind: str, seconds: float) -> None:
  """Records work of `kind` that was not announced before it ran (a
  compilation, known only once it is over)."""
  with _progress.lock:
    _progress.took(kind, seconds)


def seed(learned: Learned) -> None:
  """Starts from what an earlier attempt learned (the next attempt's first
  step then has its deadline)."""
  with _progress.lock:
    _progress.learned_steps.extend(learned.step_seconds)
    for kind, seconds in learned.work_seconds.items():
      _progress.took(kind, seconds)


def snapshot() -> Snapshot:
  """A copy of this process's progress, safe to read from any thread."""
  return _progress.snapshot()


def summarize(seconds: list[float]) -> dict[str, Optional[float]]:
  """{'median', 'p99', 'count'} of a list of durations (None when empty)."""
  if not seconds:
    return {'median': None, 'p99': None, 'count': 0}
  values = np.asarray(seconds, np.float64)
  return {
      'median': float(np.median(values)),
      'p99': float(np.percentile(values, 99)),
      'count': len(seconds)
  }


def reset_for_tests() -> None:
  """Forgets every report, as a new process would start (a test that plays
  two attempts in one process; tests/process_state.py gives every test a
  fresh report)."""
  global _progress
  _progress = _Progress()
