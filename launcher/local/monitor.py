"""Watching a local pod until it ends or must be ended: one loop, one state.

The gang is in one `GangState` at a time. While it is RUNNING or DRAINING
(a preemption under way: the ranks are saving) the loop looks at the ranks'
exit codes, the signals the launcher got and the ranks' progress, ten times a
second or as soon as something changes; any other state ends the watch, and
`End` says which and why.

Example:
  >>> end = Monitor(ranks, progress, signals, changed, timeouts).watch(start)
  >>> end.state
  <GangState.FAILED: 'failed'>
"""

import dataclasses
import enum
import signal
import threading
import time
from typing import Callable, Optional

from launcher.common import flag_spec
from launcher.common import process_flags
from launcher.local import members as members_lib
from launcher.local import output
from runtime.common import exit_codes

# The ranks' own watchdog (launcher/process/supervisor.py) fires at the
# timeouts; the pod's fires this much later, for a rank too stuck for that.
WATCHDOG_BACKSTOP_S = 15.0


class GangState(enum.Enum):
  """Where a local pod stands."""
  RUNNING = 'running'
  DRAINING = 'draining'  # A preemption notice: every rank is saving.
  SUCCEEDED = 'succeeded'  # Every rank exited 0.
  FAILED = 'failed'  # A rank failed; `End.rank` is the cause.
  PREEMPTED = 'preempted'  # Every rank exited, and they saved.
  PREEMPTION_LATE = 'late'  # Some rank did not save within the grace.
  STALLED = 'stalled'  # No step completed within the timeouts.
  INTERRUPTED = 'interrupted'  # The launcher got SIGINT, or a 2nd signal.


@dataclasses.dataclass(frozen=True)
class End:
  """Why the watch ended: the final state and what led there."""
  state: GangState
  member: Optional[members_lib.Member] = None
  signum: Optional[int] = None
  message: str = ''


@dataclasses.dataclass(frozen=True)
class Timeouts:
  """The pod's side of the hang watchdog, and its graces (s); each field
  the flag its declaration names.

  Attributes:
    stall, first_step: --stall_timeout and --first_step_timeout, the ranks'
      own, which the pod enforces as a backstop.
    preemption_grace: seconds the ranks get to save after a notice.
    kill_grace: seconds from the SIGINT that stops the ranks to SIGKILL.
  """
  stall: float = flag_spec.same_as(process_flags.WatchFlags, 'stall_timeout')
  first_step: float = flag_spec.same_as(process_flags.WatchFlags,
                                        'first_step_timeout')
  kill_grace: float = flag_spec.flag(
      5, flag_spec.LOCAL_POD,
      'seconds from the SIGINT that stops the ranks to SIGKILL',
      'Local pod: seconds between the SIGINT that stops the other ranks after '
      'a failure (or the signal forwarded from a Ctrl-C) and SIGKILL.')
  preemption_grace: float = flag_spec.flag(
      120,
      flag_spec.LOCAL_POD,
      'seconds to save after a preemption notice',
      'Local pod: seconds the ranks get, after a preemption notice, to save a '
      'checkpoint and exit before they are killed.',
      pod_sets=True)


class Monitor:
  """Watches the ranks, the launcher's signals and the ranks' progress.

  Args:
    ranks: the pod's ranks, whose exit codes the waiter threads fill in.
    progress: the ranks' completed steps.
    signals: the signals the launcher got, in order (appended by its
      handler).
    changed: set whenever a rank exits or a signal comes.
    timeouts: see Timeouts.
    forward: sends a signal to every running rank.
    should_grow: monotonic time -> whether lost processes are back, so that
      the gang should save at a step boundary and end to grow (an elastic
      pod, launcher/local/elastic.py); `regrowing` then says so.
  """

  def __init__(self,
               members: list[members_lib.Member],
               progress: output.Progress,
               signals: list[int],
               changed: threading.Event,
               timeouts: Timeouts,
               forward: Callable[[int], None],
               should_grow: Callable[[float], bool] = lambda now: False):
    self._should_grow = should_grow
    self.regrowing = False
    self._members = members
    self._progress = progress
    self._signals = signals
    self._changed = changed
    self._timeouts = timeouts
    self._forward = forward
    self._grace_deadline: Optional[float] = None

  def watch(self, started: float) -> End:
    """Blocks until the gang leaves RUNNING and DRAINING; returns how."""
    state = GangState.RUNNING
    while True:
      end = self._check(state, time.monotonic(), started)
      if end.state not in (GangState.RUNNING, GangState.DRAINING):
        return end
      if end.state is GangState.DRAINING and state is GangState.RUNNING:
        self._begin_draining()
      state = end.state
      self._changed.wait(0.1)
      self._changed.clear()

  def _begin_draining(self) -> None:
    # SIGTERM to the launcher, or lost processes back: a notice for every
    # rank, which saves the step they agree on.
    if self._signals or self.regrowing:
      self._forward(signal.SIGTERM)
    self._grace_deadline = (time.monotonic() + self._timeouts.preemption_grace)

  def _check(self, state: GangState, now: float, started: float) -> End:
    """The state the gang is in now."""
    exited = [r for r in self._members if r.exit_code is not None]
    failed = [
        r for r in exited
        if r.exit_code not in (exit_codes.OK, exit_codes.PREEMPTED)
    ]
    preempted = any(r.exit_code == exit_codes.PREEMPTED for r in exited)
    all_exited = len(exited) == len(self._members)
    root = root_cause(failed, now, all_exited)
    if root is not None:
      return End(GangState.FAILED, member=root)
    if all_exited:
      return End(GangState.PREEMPTED if preempted else GangState.SUCCEEDED)
    if self._signals and (self._signals[0] != signal.SIGTERM or
                          len(self._signals) > 1):
      return End(GangState.INTERRUPTED, signum=self._signals[0])
    if state is GangState.RUNNING:
      if self._signals or preempted:
        return End(GangState.DRAINING)
      # Only once this attempt trains: a notice during start-up saves
      # nothing new.
      if (self._progress.last_advance is not None and self._should_grow(now)):
        self.regrowing = True
        return End(GangState.DRAINING)
      stall = self._stall_message(now - started)
      return End(GangState.STALLED, message=stall) if stall else End(state)
    if self._grace_deadline is not None and now > self._grace_deadline:
      late = ', '.join(
          f'rank {r.index}/{len(self._members)}' for r in self._members
          if r.exit_code is None)
      return End(
          GangState.PREEMPTION_LATE,
          message=(
              f'{late} did not save and exit within --preemption_grace='
              f'{self._timeouts.preemption_grace:g} s of the preemption notice'
          ))
    return End(state)

  def _stall_message(self, elapsed: float) -> str:
    """Why the gang is stalled, or '' while it is not."""
    backstop, timeouts = WATCHDOG_BACKSTOP_S, self._timeouts
    last_advance = self._progress.last_advance
    if last_advance is None:
      if 0 < timeouts.first_step < elapsed - backstop:
        return (f'no rank completed its first step within '
                f'{timeouts.first_step:g} s (--first_step_timeout), and '
                f'the ranks\' own watchdogs did not end them {backstop:g} s '
                'later')
      return ''
    idle = time.monotonic() - last_advance
    if 0 < timeouts.stall < idle - backstop:
      steps = ', '.join(f'rank {r.index}: {r.step}' for r in self._members)
      return (f'no rank completed a step for {idle:.0f} s (--stall_timeout='
              f'{timeouts.stall:g}, and the ranks\' own watchdogs did not '
              f'end them {backstop:g} s later); last completed steps: {steps}')
    return ''


def root_cause(failed: list[members_lib.Member], now: float,
               all_exited: bool) -> Optional[members_lib.Member]:
  """The rank whose failure ended the job, once it is known
  (exit_codes.root_cause: the rule the TPU driver follows too)."""
  exits = []
  for r in failed:
    # await_exit notes the time before the code: a code means both.
    assert r.exited_at is not None and r.exit_code is not None, r.index
    exits.append((r.exited_at, r.exit_code))
  found = exit_codes.root_cause(exits, now, all_exited)
  return None if found is None else failed[found]
