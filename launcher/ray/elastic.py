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
  >>> resize = resize_after(capacity, say=print)
  >>> resize(restart.AttemptEnd(137, progressed=True, lost=(2,)))  # 3 run on
  Resize(kind=<Kind.SHRINK: 'shrink'>, wait_s=0.0)
"""

import dataclasses
from typing import Callable, Optional

from launcher import elastic
from launcher import restart


@dataclasses.dataclass
class Capacity:
  """How many processes the job has now.

  Attributes:
    full: N, --num_processes.
    minimum: K, --min_processes: the fewest it runs on.
    current: the processes of the next (or running) attempt.
  """
  full: int
  minimum: int
  current: int = 0

  def __post_init__(self):
    if not 1 <= self.minimum <= self.full:
      raise ValueError(
          f'--min_processes={self.minimum} with --num_processes={self.full}: '
          f'it must be from 1 to {self.full}')
    self.current = self.current or self.full

  @property
  def elastic(self) -> bool:
    return self.minimum < self.full

  def describe(self) -> str:
    away = self.full - self.current
    return (f'{self.current} of {self.full} process(es)' +
            (f', {away} to come back when Ray has a node for each' if away
             else ''))


def resize_after(capacity: Capacity, say: Callable[[str], None]):
  """restart.run's `resize` for an elastic job on Ray.

  Returns:
    how an attempt ended (restart.AttemptEnd) -> an elastic.Resize after a
    lost node or a stop to grow, else None (the usual restart rules). The
    end says which ranks it lost (`lost`) and, after a stop to grow, how
    many nodes it saw spare (`back`).
  """
  def resize(end: restart.AttemptEnd) -> Optional[elastic.Resize]:
    lost = len(end.lost) if end.progressed else 0
    kind = elastic.decide(end.code, end.regrew, lost,
                          capacity.current - lost, capacity.minimum)
    if kind is None:
      return None
    if kind == elastic.GROW:
      capacity.current = min(capacity.full,
                             capacity.current + max(1, end.back))
      say(f'node(s) back: starting again at once on {capacity.describe()}, '
          'from the step every rank saved')
      return elastic.Resize(kind)
    ranks = ', '.join(map(str, end.lost))
    capacity.current -= lost
    if kind == elastic.SHRINK:
      say(f'rank(s) {ranks} lost with their node(s): starting again at once '
          f'on {capacity.describe()}, the same global batch on fewer devices')
      return elastic.Resize(kind)
    capacity.current = capacity.minimum
    say(f'rank(s) {ranks} lost with their node(s): fewer than '
        f'--min_processes={capacity.minimum} left; the next attempt waits '
        f'for {capacity.minimum} nodes (--start_timeout)')
    return elastic.Resize(kind)
  return resize
