"""One elastic policy: what the next attempt of an elastic job runs on.

A local pod (--min_processes, launcher/local/elastic.py), a TPU launch
(--min_slices, launcher/tpu/elastic.py) and a Ray job (--min_processes,
launcher/ray/) lose units of their own kind (a process, a slice, a node)
and take the same decision after each attempt, `decide`; each then says
how long the next attempt waits and what it told the user. restart.run
reads the `Resize` that results.

Example:
  >>> decide(exit_code=137, regrew=False, lost=1, left=3, minimum=2)
  <Kind.SHRINK: 'shrink'>
  >>> Resize(Kind.WAIT, wait_s=20)   # too few left: wait for enough
"""

import dataclasses
import enum
from typing import Optional

from runtime.common import exit_codes


class Kind(enum.StrEnum):
  """How the next attempt differs, as attempts.jsonl records it."""
  SHRINK = 'shrink'   # on the units left, at once
  GROW = 'grow'       # lost units are back
  WAIT = 'wait'       # too few left: wait until enough are back


SHRINK, GROW, WAIT = Kind.SHRINK, Kind.GROW, Kind.WAIT


@dataclasses.dataclass(frozen=True)
class Resize:
  """The next attempt runs on another number of processes or slices.

  Attributes:
    kind: SHRINK, GROW or WAIT.
    wait_s: how long to wait before that attempt starts.
  """
  kind: Kind
  wait_s: float = 0.0

  def __post_init__(self):
    try:
      object.__setattr__(self, 'kind', Kind(self.kind))
    except ValueError:
      raise ValueError(f'Resize kind {self.kind!r}; one of '
                       f'{[k.value for k in Kind]}') from None


def decide(exit_code: int, regrew: bool, lost: int, left: int,
           minimum: int) -> Optional[Kind]:
  """What an elastic job does after an attempt; None: the usual restart
  rules (launcher/restart.py) decide.

  Args:
    exit_code: the attempt's.
    regrew: the launcher stopped it at a step boundary because lost units
      were back.
    lost: how many of its units were lost and count as lost hosts (0 when
      none did, or when the attempt trained no step: a unit that cannot
      start is no lost host).
    left: the units the next attempt can have now.
    minimum: the fewest a job runs on (--min_processes, --min_slices).

  Returns:
    GROW after the stop to grow; after a loss, SHRINK when at least
    `minimum` are left, else WAIT for enough to be back.
  """
  if regrew and exit_code == exit_codes.PREEMPTED:
    return GROW
  if lost <= 0:
    return None
  return after_loss(left, minimum)


def after_loss(left: int, minimum: int) -> Kind:
  """SHRINK onto the `left` units when they are at least `minimum`, else
  WAIT for enough to be back."""
  return SHRINK if left >= minimum else WAIT
