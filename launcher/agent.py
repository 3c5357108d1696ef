"""The job agent: one owner of a whole job's life, for every launcher.

A launcher that starts a job whole (the local pod, the TPU driver,
podrun-ray) describes it once as a `Job`: how to start an attempt, the
restart policy, where attempts.jsonl goes, and, where units can be lost and
come back, its `elastic.Capacity`. The agent runs one monitor loop over it,
as torchelastic's agent does over its worker group:

  STARTING   the capacity's `ready` (every attempt after the first), then
             the launcher's attempt, given the agent's `grow_due` (`should_grow`)
  RUNNING    the attempt runs to its end (`attempts.AttemptEnd`)
  RESTARTING the end read: a resize (elastic.Policy), a restart with its
             back-off (launcher/restart.py), or the job's end
  ENDED      the job's exit code; the launcher's `finish` completes the
             record once

Only the agent asks the capacity `ready` and `grow_due`, and only the agent
starts an attempt again (tests/test_boundary.py holds both).

Example:
  >>> job = Job(start=lambda s: Gang(spec, s), restarts=RestartPolicy(3),
  ...           logs_dir='workdirs/mnist/logs')
  >>> run(job)
  0
"""

import dataclasses
import enum
import signal
import time
from typing import Callable, Optional, Protocol, cast

from launcher import attempts
from launcher import elastic
from launcher import restart
from launcher import signals
from runtime.common import exit_codes
from runtime.common import goodput
from runtime.common import records


class State(enum.StrEnum):
  """Where the agent is in a job's life."""
  STARTING = 'starting'
  RUNNING = 'running'
  RESTARTING = 'restarting'
  ENDED = 'ended'


@dataclasses.dataclass(frozen=True)
class Start:
  """What the agent gives each attempt it starts.

  Attributes:
    number: 1, 2, ... within the job.
    ready: what the capacity's `ready` said before it (always ready for the
      first, or without a capacity); its `infrastructure` is what bringing
      units back took.
    should_grow: time.monotonic() -> whether lost units are back, so that
      the attempt stops at a step boundary for the job to grow: the agent
      asks its capacity's `grow_due`.
  """
  number: int
  ready: elastic.Ready
  should_grow: Callable[[float], bool]


class Units(Protocol):
  """What the agent asks of what a job runs on (an `elastic.Capacity`, or
  a TPU launch's slices, which are brought back after a loss)."""

  def ready(self, now: float) -> elastic.Ready:
    """Before every attempt after the first: waits until the units are
    there (not ready when they cannot come: the attempt ends at once)."""

  def grow_due(self, now: float) -> bool:
    """Whether lost units are back, so that the running attempt should stop
    at a step boundary and the job grow."""


def _never(now: float) -> bool:
  del now
  return False


@dataclasses.dataclass
class Job:
  """A job as its launcher describes it to the agent.

  Attributes:
    start: a `Start` -> the attempt to run (an `attempts.Attempt`).
    restarts: how many restarts, after which exit codes, how far apart.
    logs_dir: where attempts.jsonl records each attempt's end.
    capacity: the units an elastic job, or one whose units are brought back
      (a TPU slice recreated), runs on; None for a fixed set that nothing
      brings back.
    elastic: the job shrinks onto the units left after a loss and grows
      back (`capacity` is an `elastic.Capacity`): the agent decides each
      resize with the one `elastic.Policy`; False: the usual restart rules.
    say: how to tell the user.
    on_signal: told of a SIGINT or SIGTERM that comes during a back-off,
      so that the launcher ends as that signal does elsewhere (the TPU
      driver deletes what it created).
    pending_signal: a signal the launcher already got between attempts.
    finish: the job's exit code -> nothing; completes the record (goodput,
      job.json, a bucket's upload) once, after the last attempt, however
      the job ended.
  """
  start: Callable[[Start], attempts.Attempt]
  restarts: restart.RestartPolicy
  logs_dir: str
  capacity: Optional[Units] = None
  elastic: bool = False
  say: Callable[[str], None] = restart.console_say
  on_signal: Optional[Callable[[int], None]] = None
  pending_signal: Callable[[], Optional[int]] = lambda: None
  finish: Optional[Callable[[int], None]] = None


class Agent:
  """Runs a `Job`'s attempts until one ends for good (`run`)."""

  def __init__(self, job: Job):
    self.job = job
    self.state = State.STARTING
    self.tally = restart.Tally()
    self._high_water = HighWater()
    # The one place a job's elastic policy is made, for every launcher.
    self._policy = (elastic.Policy(cast(elastic.Capacity, job.capacity),
                                   job.say)
                    if job.elastic and job.capacity is not None else None)

  def grow_due(self, now: float) -> bool:
    """Whether the running attempt should stop at a step boundary for lost
    units that are back (the capacity's say)."""
    capacity = self.job.capacity
    return capacity is not None and capacity.grow_due(now)

  def _start(self, number: int) -> attempts.Attempt:
    capacity = self.job.capacity
    ready = (capacity.ready(time.monotonic())
             if capacity is not None and number > 1 else elastic.Ready(True))
    return self.job.start(
        Start(number, ready, self.grow_due if capacity is not None else _never))

  def run(self) -> int:
    """Runs attempts until one ends for good; returns its exit code, after
    the job's `finish`.

    An attempt whose launcher got SIGINT or SIGTERM is not restarted: that
    stop came from whoever runs the launcher. A signal during a back-off
    ends the job with 128 + its number.
    """
    code: int = exit_codes.FAILED
    try:
      code = self._attempts()
    finally:
      self.state = State.ENDED
      if self.job.finish is not None:
        self.job.finish(code)
    return code

  def _attempts(self) -> int:
    job, tally = self.job, self.tally
    launcher_started = goodput.process_start_time()
    number = 1
    while True:
      self.state = State.STARTING
      attempt = self._start(number)
      started = time.time()
      self.state = State.RUNNING
      end = attempt.run()
      self.state = State.RESTARTING
      code = end.code
      kind = restart.kind_of(code, job.restarts.retryable)
      newly_productive = self._high_water.advanced_by(end)
      resized, bounded = self._resize_after(end, kind, newly_productive)
      records.append_attempt(
          job.logs_dir,
          _record(number, end, kind, launcher_started, started, resized))
      if bounded:
        break
      wait: Optional[float]
      if resized:
        tally.count_resize(resized.kind)
        wait = resized.wait_s
      else:
        wait = restart.wait_before_restart(end, kind, job.restarts, tally,
                                           job.say, newly_productive)
        if wait is None:
          break
      signalled = job.pending_signal() or _sleep_unless_signalled(wait)
      if signalled:
        code = self._stopped_by(signalled)
        break
      number += 1
    if (job.restarts.max_restarts or tally.shrinks or tally.grows or
        tally.waits):
      job.say(f'job ended with exit code {code} after {tally.describe()}')
    return code

  def _resize_after(
      self, end: attempts.AttemptEnd, kind: str,
      newly_productive: bool) -> tuple[Optional[elastic.Resize], bool]:
    """(the resize the next attempt starts with, or None for the usual
    rules; whether the job ends here, a resize having no restart left)."""
    if kind == 'ok' or end.launcher_signalled or self._policy is None:
      return None, False
    resized = self._policy.after(end)
    # A stop to grow is the launcher's own doing; a loss after an attempt
    # that trained nothing new may be the same failure again.
    if (resized and resized.kind != elastic.GROW and not newly_productive and
        not self._resize_counted(resized.kind, end.code)):
      return None, True
    return resized, False

  def _resize_counted(self, what: str, code: int) -> bool:
    """Counts against --max_restarts a resize after an attempt that trained
    no new step (a failure that comes back at the same step on any number
    of processes would otherwise resize forever); False when none are
    left."""
    tally, most = self.tally, self.job.restarts.max_restarts
    step = self._high_water.step
    reached = ('no step'
               if step is None else f'no step past {step}, reached before')
    if tally.restarts >= most:
      self.job.say(f'not starting again ({what}) after exit code {code}: the '
                   f'attempt trained {reached}, and --max_restarts={most} is '
                   'used up')
      return False
    tally.restarts += 1
    self.job.say(f'{what} after exit code {code} counted as restart '
                 f'{tally.restarts}/{most}: the attempt trained {reached}')
    return True

  def _stopped_by(self, signalled: int) -> int:
    """The job's exit code after a signal during a back-off, the launcher
    told of it first."""
    self.job.say(f'got {signal.Signals(signalled).name} while waiting to '
                 'restart: not restarting')
    if self.job.on_signal is not None:
      self.job.on_signal(signalled)
    return exit_codes.SIGNAL_BASE + signalled


def run(job: Job) -> int:
  """Runs `job` to its end (`Agent.run`); its exit code."""
  return Agent(job).run()


class HighWater:
  """The furthest step any attempt of this job completed."""

  def __init__(self):
    self.step: Optional[int] = None

  def advanced_by(self, end: attempts.AttemptEnd) -> bool:
    """Whether the attempt that ended so completed a step past every
    attempt before it (True when it cannot tell); keeps its furthest
    step."""
    if not end.counts_steps:
      return True
    furthest = end.furthest_step
    if furthest is None:
      return False
    advanced = self.step is None or furthest > self.step
    self.step = furthest if advanced else self.step
    return advanced


def _record(number: int, end: attempts.AttemptEnd, kind: str,
            launcher_started: float, started: float,
            resized: Optional[elastic.Resize]) -> records.LauncherAttempt:
  """attempts.jsonl's line for an attempt that just ended."""
  return records.LauncherAttempt(attempt=number,
                                 exit_code=end.code,
                                 kind=kind,
                                 name=end.name,
                                 launcher_started=launcher_started,
                                 started=started,
                                 ended=time.time(),
                                 launcher_signalled=end.launcher_signalled,
                                 fault=end.fault,
                                 infrastructure=end.infrastructure,
                                 resize=resized.kind.value if resized else None,
                                 processes=end.processes)


def _sleep_unless_signalled(seconds: float) -> Optional[int]:
  """Sleeps; returns the SIGINT or SIGTERM that came meanwhile, if one did."""
  signalled = []
  with signals.handled((signal.SIGINT, signal.SIGTERM),
                       lambda n, f: signalled.append(n)):
    deadline = time.monotonic() + seconds
    while not signalled and time.monotonic() < deadline:
      time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
  return signalled[0] if signalled else None
