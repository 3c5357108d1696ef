"""An elastic job on a Ray cluster: fewer nodes while one is gone, then back.

With --min_processes=K (and --num_processes=N, K < N) a node that dies
under the job is a lost host, as everywhere (launcher/elastic.py decides):

- at least K processes left: the job starts again at once on them, on a
  fresh placement group of as many bundles (the same global batch on fewer
  devices, restored from the copies the survivors hold);
- fewer left: the next attempt asks for K bundles and waits for them up to
  --start_timeout, then ends with 6 (no capacity) if they never come;
- while it runs on fewer than N, the attempt watches for live nodes outside
  its group that hold a bundle free; once one does, every process saves the
  step they agree on (the preemption notice) and the job starts again on
  more, up to N.

A process that cannot start, or a loss before any step completed, is judged
by the usual restart rules. Shrinks and growths use no restart unless the
attempt before trained nothing new (launcher/restart.py).

Example:
  >>> capacity = Capacity(full=4, minimum=3)
  >>> resize = elastic.Policy(capacity, say=print).after
  >>> resize(attempts.AttemptEnd(137, progressed=True, lost=(2,)))  # 3 run on
  Resize(kind=<Kind.SHRINK: 'shrink'>, wait_s=0.0)
"""

import dataclasses
from typing import Callable

from launcher import attempts
from launcher import elastic as policy

# How often a job below --num_processes asks Ray for nodes with a bundle
# free outside it.
LOOK_EVERY_S = 1.0


@dataclasses.dataclass
class Capacity:
  """How many processes the job has now; an elastic.Capacity.

  Attributes:
    full: N, --num_processes.
    minimum: K, --min_processes: the fewest it runs on.
    current: the processes of the next (or running) attempt.
    spare: the nodes with a bundle free outside the job that `grow_due`
      saw last; the growth takes in that many, at least 1, at most N in
      all.
    look: `() -> spare`, set by the running attempt to ask its placement
      group (0 before its processes train: a process may not take the
      notice to save before then).
  """
  full: int
  minimum: int
  current: int = 0
  spare: int = 0
  look: Callable[[], int] = lambda: 0
  flag = '--min_processes'
  _next_look: float = 0.0

  def __post_init__(self):
    if not 1 <= self.minimum <= self.full:
      raise ValueError(
          f'--min_processes={self.minimum} with --num_processes={self.full}: '
          f'it must be from 1 to {self.full}')
    self.current = self.current or self.full

  @property
  def elastic(self) -> bool:
    return self.minimum < self.full

  def running(self) -> int:
    return self.current

  def lose(self, end: attempts.AttemptEnd) -> str:
    self.current -= len(end.lost)
    return (f'rank(s) {", ".join(map(str, end.lost))} lost with their '
            'node(s)')

  def grow_due(self, now: float) -> bool:
    """Whether a node with a bundle free is outside the job while it runs
    on fewer than N (asked every LOOK_EVERY_S)."""
    if self.current >= self.full or now < self._next_look:
      return False
    self._next_look = now + LOOK_EVERY_S
    self.spare = self.look()
    return self.spare > 0

  def waiting(self) -> tuple[float, str]:
    """The next attempt asks for K bundles, and waits for them (`ready`)."""
    return 0.0, (f'the next attempt waits for {self.minimum} nodes '
                 '(--start_timeout)')

  def take_back(self) -> str:
    self.current = min(self.full, self.current + max(1, self.spare))
    self.spare = 0
    return 'node(s) back'

  def ready(self, now: float) -> policy.Ready:
    """Below K, the attempt asks for K bundles: its placement group waits
    for them up to --start_timeout, and the attempt ends with 6 (no
    capacity) when they never come."""
    del now
    self.current = max(self.current, self.minimum)
    self.look = lambda: 0  # The attempt that set it has ended.
    return policy.Ready(True)

  def describe(self) -> str:
    away = self.full - self.current
    return (
        f'{self.current} of {self.full} process(es)' +
        (f', {away} to come back when Ray has a node for each' if away else ''))
