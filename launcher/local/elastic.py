"""An elastic local pod: fewer processes while a lost one is away, then back.

With --min_processes=K a local pod of P processes takes a process that dies
of SIGKILL, or of an exit code the restart policy retries, for a lost host.
The job starts again at once on the others (at least K), from the state they
hold; the lost process "comes back" --regrow_after seconds later (the local
stand-in for a replacement host), and then the running attempt is stopped
at a step boundary as a preemption stops it (every process saves the step
they agree on) and the job starts again on all of them. Every attempt trains
the same global batch on the same data (runtime/parallelism/microbatches.py
pads and accumulates), so a shrink or a growth changes how fast the job
runs, not what it computes.

Fewer than K left: the launcher waits until enough are back, then starts
the job on all it has (the local stand-in for waiting for capacity). With
--min_processes equal to --local_processes every loss waits so: the job of
a launcher that waits for every host, side by side with an elastic one.

Shrinks and waits do not use --max_restarts when the attempt before them
trained a step past every attempt before it; after one that only trained
again what was trained before (a failure that comes back at the same step,
on any number of processes), each uses a restart, and the job ends with the
failure's exit code once --max_restarts is used up (launcher/restart.py).
Growths never use one. A loss before any step completed is judged by the
usual restart rules (a process that cannot start is no lost host).

Example:
  >>> capacity = Capacity(full=4, minimum=2, regrow_after_s=30)
  >>> policy = elastic.Policy(capacity, say=print)
  >>> policy.after(attempts.AttemptEnd(137, progressed=True, lost=(3,)))
  rank 3 lost (exit code 137): starting again at once on 3 of 4 ...
  Resize(kind=<Kind.SHRINK: 'shrink'>, wait_s=0.0)
  >>> capacity.grow_due(now=time.monotonic() + 31)
  True
"""

import dataclasses
import signal
import time
from typing import Callable, Optional

from launcher import attempts
from launcher import elastic as policy
from runtime.common import exit_codes


def is_lost_process(exit_code: Optional[int], retryable: tuple[int,
                                                               ...]) -> bool:
  """Whether a process that ended with `exit_code` is taken for a lost host:
  SIGKILL (the OOM killer, a machine gone) or a retried exit code."""
  if exit_code is None or exit_code == exit_codes.PREEMPTED:
    return False
  return (exit_code == exit_codes.SIGNAL_BASE + signal.SIGKILL or
          exit_code in retryable)


@dataclasses.dataclass
class Capacity:
  """How many processes the job has now, and when lost ones come back; an
  elastic.Capacity.

  Attributes:
    full: P, the processes the job was started with.
    minimum: K, the fewest it runs on; below that it waits (restarts).
    regrow_after_s: how long a lost process stays away.
    current: the processes of the next attempt.
    returns: monotonic times at which lost processes come back.
    clock: now, as time.monotonic() tells it.
    flag: the flag that set `minimum`, as the user wrote it.
  """
  full: int
  minimum: int
  regrow_after_s: float
  current: int = 0
  returns: list[float] = dataclasses.field(default_factory=list)
  clock: Callable[[], float] = time.monotonic
  # The flag that set `minimum`: --min_replicas counts the same processes.
  flag: str = '--min_processes'

  def __post_init__(self):
    if not 1 <= self.minimum <= self.full:
      raise ValueError(f'{self.flag}={self.minimum} with --local_processes='
                       f'{self.full}: it must be from 1 to {self.full}')
    if self.regrow_after_s < 0:
      raise ValueError(f'--regrow_after={self.regrow_after_s:g}: it must be '
                       'at least 0 seconds')
    self.current = self.current or self.full

  def running(self) -> int:
    return self.current

  def lose(self, end: attempts.AttemptEnd) -> str:
    """Each process of `end.lost` is away for --regrow_after seconds."""
    now = self.clock()
    self.current -= len(end.lost)
    self.returns.extend([now + self.regrow_after_s] * len(end.lost))
    code = f' (exit code {end.fault.exit_code})' if end.fault else ''
    return f'rank {", ".join(map(str, end.lost))} lost{code}'

  def waiting(self) -> tuple[float, str]:
    """Until the lost process that brings the job back to K returns."""
    needed = sorted(self.returns)[self.minimum - self.current - 1]
    wait_s = max(0.0, needed - self.clock())
    return wait_s, (f'waiting {wait_s:.1f} s for enough to be back '
                    f'({self.regrow_after_s:g} s after their loss, '
                    '--regrow_after)')

  def grow_due(self, now: float) -> bool:
    """Whether a lost process is back, so the running attempt should stop
    at a step boundary and the job grow."""
    return bool(self.returns) and min(self.returns) <= now

  def take_back(self) -> str:
    self._back(self.clock())
    return 'lost process(es) back'

  def ready(self, now: float) -> policy.Ready:
    """Takes back every lost process whose time has come. The launcher
    slept `waiting`'s seconds before, so K are back."""
    self._back(now)
    return policy.Ready(True)

  def _back(self, now: float) -> None:
    back = [t for t in self.returns if t <= now]
    self.returns = [t for t in self.returns if t > now]
    self.current += len(back)

  def describe(self) -> str:
    away = self.full - self.current
    return (f'{self.current} of {self.full} process(es)' +
            (f', {away} coming back' if away else ''))
