"""Restarting a whole job after a preemption (--max_restarts).

A preempted job saved a checkpoint of the step all its ranks agreed on, so
starting the same job again resumes exactly there. Other failures are retried
only when their exit code is marked retryable (--retry_exit_codes or
config.retry_exit_codes); a user's own mistake (exit_codes.NEVER_RETRIED) is
never retried, since it would fail the same way again. Each restart waits a
back-off that doubles from --restart_backoff up to a minute. Every
launcher reads those flags once into a `RestartPolicy`; a local pod
(launcher/local/pod.py), a TPU pod's attempt (launcher/tpu/attempt.py) and
a Ray job's (launcher/ray/attempt.py) are each an `attempts.Attempt`, whose
`run` returns an `attempts.AttemptEnd`.

Example:
  >>> restarts = RestartPolicy(max_restarts=3, retryable=(137,))
  >>> run(lambda number: Gang(spec, 4, job_id, number), restarts,
  ...     logs_dir='workdirs/mnist/logs')
  0
"""

import dataclasses
import signal
import sys
import time
from typing import Callable, Iterable, Optional

from launcher import attempts
from launcher import elastic
from launcher import signals
from runtime.common import exit_codes
from runtime.common import goodput
from runtime.common import records

MAX_BACKOFF_S = 60.0


def check_retryable(codes: Iterable[int]) -> tuple[int, ...]:
  """Validates exit codes marked retryable.

  Raises:
    ValueError: for a code that is never retried, naming it.
  """
  codes = tuple(sorted(set(int(c) for c in codes)))
  refused = [c for c in codes if c in exit_codes.NEVER_RETRIED]
  if refused:
    never = '; '.join(f'{int(c)}: {c.meaning}'
                      for c in exit_codes.NEVER_RETRIED)
    raise ValueError(
        f'exit code(s) {refused} cannot be retried, since a run that ended '
        f'so would end the same way again ({never})')
  return codes


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
  """How a launcher restarts its job, the same for every launcher (as
  torchelastic's WorkerSpec holds max_restarts); read once from the flags.

  Attributes:
    max_restarts: how many times the job starts again at most
      (--max_restarts).
    first_backoff_s: the wait before the second restart in a row after
      attempts that trained nothing new, doubling up to MAX_BACKOFF_S
      (--restart_backoff).
    retryable: exit codes besides PREEMPTED that are restarted
      (--retry_exit_codes), ascending.

  Raises:
    ValueError: for a negative count or back-off, or an exit code that is
      never retried (check_retryable), naming it.
  """
  max_restarts: int = 0
  first_backoff_s: float = 1.0
  retryable: tuple[int, ...] = ()

  def __post_init__(self):
    if self.max_restarts < 0 or self.first_backoff_s < 0:
      raise ValueError(
          f'--max_restarts={self.max_restarts}, --restart_backoff='
          f'{self.first_backoff_s:g}: neither may be negative')
    object.__setattr__(self, 'retryable', check_retryable(self.retryable))


@dataclasses.dataclass
class Tally:
  """How the attempts of a job ended."""
  preemptions: int = 0
  failures: int = 0
  restarts: int = 0
  # Attempts in a row that ended without completing a step.
  unproductive: int = 0
  # An elastic job's starts on fewer or more processes (no restarts).
  shrinks: int = 0
  grows: int = 0
  waits: int = 0  # For lost processes to be back, too few being left.

  def count_resize(self, kind: str) -> None:
    setattr(self, kind + 's', getattr(self, kind + 's') + 1)

  def describe(self) -> str:
    text = (f'{self.restarts} restart(s): {self.preemptions} preemption(s), '
            f'{self.failures} retryable failure(s)')
    if self.shrinks or self.grows or self.waits:
      text += (f'; {self.shrinks} shrink(s), {self.grows} growth(s) and '
               f'{self.waits} wait(s) for capacity')
    return text


def kind_of(code: int, retryable: tuple[int, ...]) -> str:
  """'ok', 'preempted', 'retryable' or 'final' for an attempt's exit code."""
  if code == exit_codes.OK:
    return 'ok'
  if code == exit_codes.PREEMPTED:
    return 'preempted'
  if code in retryable and code not in exit_codes.NEVER_RETRIED:
    return 'retryable'
  return 'final'


def backoff_s(first: float, restart_number: int) -> float:
  """The wait before restart number `restart_number` (1, 2, ...) of a
  series of attempts that failed without completing a step.

  The first is at once: a single fault (a SIGKILL, a preemption) then costs
  no waiting, and the local checkpoint tier makes it cheap to resume. Only
  a job that keeps failing backs off, from `first` seconds, doubling, at
  most MAX_BACKOFF_S.
  """
  if restart_number <= 1:
    return 0.0
  return min(first * 2 ** (restart_number - 2), MAX_BACKOFF_S)


def console_say(message: str) -> None:
  print(f'[launcher] {message}', file=sys.stderr, flush=True)


def _sleep_unless_signalled(seconds: float) -> Optional[int]:
  """Sleeps; returns the SIGINT or SIGTERM that came meanwhile, if one did."""
  signalled = []
  with signals.handled((signal.SIGINT, signal.SIGTERM),
                       lambda n, f: signalled.append(n)):
    deadline = time.monotonic() + seconds
    while not signalled and time.monotonic() < deadline:
      time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
  return signalled[0] if signalled else None


def run(start_attempt: Callable[[int], attempts.Attempt],
        restarts: RestartPolicy, logs_dir: str,
        say: Callable[[str], None] = console_say,
        on_signal: Optional[Callable[[int], None]] = None,
        pending_signal: Callable[[], Optional[int]] = lambda: None,
        resize: Optional[Callable[[attempts.AttemptEnd],
                                  Optional[elastic.Resize]]] = None) -> int:
  """Runs attempts until one ends for good; returns its exit code.

  Args:
    start_attempt: attempt number (1, 2, ...) -> the Attempt to run.
    restarts: how many restarts, after which exit codes, how far apart.
    logs_dir: where attempts.jsonl records each attempt's end.
    say: how to tell the user.
    on_signal: told of a SIGINT or SIGTERM that comes during a back-off,
      so that the caller ends the launch as that signal does elsewhere
      (the TPU driver deletes what it created).
    pending_signal: a signal the caller already got between attempts.
    resize: an attempt's end -> the elastic.Resize to start the next on
      another number of processes (elastic.Policy.after), or None for the
      usual rules. A shrink or wait uses a restart only after an
      attempt that trained no new step.

  An attempt whose launcher got SIGINT or SIGTERM is not restarted: that
  stop came from whoever runs the launcher. A signal during a back-off ends
  the launch with 128 + its number.
  """
  tally = Tally()
  attempt = 1
  launcher_started = goodput.process_start_time()
  high_water = HighWater()
  while True:
    one = start_attempt(attempt)
    started = time.time()
    end = one.run()
    code = end.code
    kind = kind_of(code, restarts.retryable)
    newly_productive = high_water.advanced_by(end)
    resized, bounded = _resize_after(
        end, kind, resize, newly_productive, high_water,
        restarts.max_restarts, tally, say)
    records.append_attempt(logs_dir, _record(
        attempt, end, kind, launcher_started, started, resized))
    if bounded:
      break
    if resized:
      tally.count_resize(resized.kind)
      wait = resized.wait_s
    else:
      wait = _restart_wait(end, kind, restarts, tally, say,
                           newly_productive)
      if wait is None:
        break
    signalled = pending_signal() or _sleep_unless_signalled(wait)
    if signalled:
      code = _stopped_by(signalled, on_signal, say)
      break
    attempt += 1
  if (restarts.max_restarts or tally.shrinks or tally.grows or
      tally.waits):
    say(f'job ended with exit code {code} after {tally.describe()}')
  return code


class HighWater:
  """The furthest step any attempt of this launch completed."""

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


def _record(attempt: int, end: attempts.AttemptEnd, kind: str,
            launcher_started: float, started: float,
            resized: Optional[elastic.Resize]) -> records.LauncherAttempt:
  """attempts.jsonl's line for an attempt that just ended."""
  return records.LauncherAttempt(
      attempt=attempt, exit_code=end.code, kind=kind, name=end.name,
      launcher_started=launcher_started, started=started, ended=time.time(),
      launcher_signalled=end.launcher_signalled,
      fault=end.fault, infrastructure=end.infrastructure,
      resize=resized.kind.value if resized else None,
      processes=end.processes)


def _resize_after(end: attempts.AttemptEnd, kind: str,
                  resize: Optional[Callable[[attempts.AttemptEnd],
                                            Optional[elastic.Resize]]],
                  newly_productive: bool, high_water: HighWater,
                  max_restarts: int, tally: Tally,
                  say: Callable[[str], None]
                  ) -> tuple[Optional[elastic.Resize], bool]:
  """(the resize the next attempt starts with, or None for the usual
  rules; whether the job ends here, a resize having no restart left)."""
  if kind == 'ok' or end.launcher_signalled or not resize:
    return None, False
  resized = resize(end)
  # A stop to grow is the launcher's own doing; a loss after an attempt
  # that trained nothing new may be the same failure again.
  if (resized and resized.kind != elastic.GROW and not newly_productive and
      not _resize_counted(resized.kind, end.code, high_water, max_restarts,
                          tally, say)):
    return None, True
  return resized, False


def _stopped_by(signalled: int, on_signal: Optional[Callable[[int], None]],
                say: Callable[[str], None]) -> int:
  """The launch's exit code after a signal during a back-off, the caller
  told of it first."""
  say(f'got {signal.Signals(signalled).name} while waiting to restart: '
      'not restarting')
  if on_signal is not None:
    on_signal(signalled)
  return exit_codes.SIGNAL_BASE + signalled


def _resize_counted(what: str, code: int, high_water: HighWater,
                    max_restarts: int, tally: Tally,
                    say: Callable[[str], None]) -> bool:
  """Counts against --max_restarts a resize after an attempt that trained
  no new step (a failure that comes back at the same step on any number of
  processes would otherwise resize forever); False when none are left."""
  reached = ('no step' if high_water.step is None else
             f'no step past {high_water.step}, reached before')
  if tally.restarts >= max_restarts:
    say(f'not starting again ({what}) after exit code {code}: the attempt '
        f'trained {reached}, and --max_restarts={max_restarts} is used up')
    return False
  tally.restarts += 1
  say(f'{what} after exit code {code} counted as restart {tally.restarts}/'
      f'{max_restarts}: the attempt trained {reached}')
  return True


def _restart_wait(end: attempts.AttemptEnd, kind: str,
                  restarts: RestartPolicy, tally: Tally,
                  say: Callable[[str], None],
                  newly_productive: bool = True) -> Optional[float]:
  """The back-off before the next attempt, counted in `tally`; None when
  the job ends here."""
  if kind == 'ok' or kind == 'final' or end.launcher_signalled:
    return None
  if kind == 'preempted':
    tally.preemptions += 1
  else:
    tally.failures += 1
  max_restarts = restarts.max_restarts
  if tally.restarts >= max_restarts:
    say(f'not restarting: --max_restarts={max_restarts} used up')
    return None
  tally.restarts += 1
  # Backing off is for a job that fails without training: one that made
  # progress before it failed (a sporadic SIGKILL, a preemption) restarts
  # at once, however many restarts came before. Steps trained again after
  # a restore are no progress: a failure at the same step each time backs
  # off.
  progressed = end.progressed and newly_productive
  tally.unproductive = 0 if progressed else tally.unproductive + 1
  wait = backoff_s(restarts.first_backoff_s, tally.unproductive + 1)
  what = ('a preemption' if kind == 'preempted'
          else f'retryable exit code {end.code}')
  say(f'restart {tally.restarts}/{max_restarts} after {what} in {wait:g} '
      f's; so far {tally.preemptions} preemption(s) and {tally.failures} '
      'retryable failure(s)')
  return wait
