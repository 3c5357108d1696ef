"""The rules for restarting a whole job (--max_restarts); the job agent
(launcher/agent.py) applies them after every attempt.

A preempted job saved a checkpoint of the step all its ranks agreed on, so
starting the same job again resumes exactly there. Other failures are retried
only when their exit code is marked retryable (--retry_exit_codes or
config.retry_exit_codes); a user's own mistake (exit_codes.NEVER_RETRIED) is
never retried, since it would fail the same way again. Each restart waits a
back-off that doubles from --restart_backoff up to a minute. Every
launcher reads those flags once into a `RestartPolicy`.

Example:
  >>> restarts = RestartPolicy(max_restarts=3, retryable=(137,))
  >>> kind_of(137, restarts.retryable), backoff_s(1.0, restart_number=3)
  ('retryable', 2.0)
"""

import dataclasses
import sys
from typing import Callable, Iterable, Optional

from launcher import attempts
from runtime.common import exit_codes

MAX_BACKOFF_S = 60.0


def check_retryable(codes: Iterable[int]) -> tuple[int, ...]:
  """Validates exit codes marked retryable.

  Raises:
    ValueError: for a code that is never retried, naming it.
  """
  codes = tuple(sorted(set(int(c) for c in codes)))
  refused = [c for c in codes if c in exit_codes.NEVER_RETRIED]
  if refused:
    never = '; '.join(
        f'{int(c)}: {c.meaning}' for c in exit_codes.NEVER_RETRIED)
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
      raise ValueError(f'--max_restarts={self.max_restarts}, --restart_backoff='
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
  return min(first * 2**(restart_number - 2), MAX_BACKOFF_S)


def console_say(message: str) -> None:
  print(f'[launcher] {message}', file=sys.stderr, flush=True)


def wait_before_restart(end: attempts.AttemptEnd,
                        kind: str,
                        restarts: RestartPolicy,
                        tally: Tally,
                        say: Callable[[str], None],
                        newly_productive: bool = True) -> Optional[float]:
  """The back-off before the next attempt, counted in `tally`; None when
  the job ends here."""
  if kind == 'final' and not end.launcher_signalled:
    _say_why_not_retried(end.code, restarts, tally, say)
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
  what = ('a preemption'
          if kind == 'preempted' else f'retryable exit code {end.code}')
  say(f'restart {tally.restarts}/{max_restarts} after {what} in {wait:g} '
      f's; so far {tally.preemptions} preemption(s) and {tally.failures} '
      'retryable failure(s)')
  return wait


def _say_why_not_retried(code: int, restarts: RestartPolicy, tally: Tally,
                         say: Callable[[str], None]) -> None:
  """Where restarts were left, one line on why this exit code ends the job:
  --max_restarts alone retries preemptions only."""
  if tally.restarts >= restarts.max_restarts:
    return
  if code in exit_codes.NEVER_RETRIED:
    meaning = exit_codes.ExitCode(code).meaning
    say(f'not restarting: exit code {code} ({meaning}) is never retried, '
        'since the run would end the same way again')
    return
  listed = ','.join(map(str, restarts.retryable)) or 'none'
  say(f'not restarting: exit code {code}{exit_codes.signal_suffix(code)} is '
      f'not retried; --max_restarts={restarts.max_restarts} restarts after a '
      f'preemption ({int(exit_codes.PREEMPTED)}) and the codes of '
      f'--retry_exit_codes ({listed}): add --retry_exit_codes={code} to '
      'restart after it')
