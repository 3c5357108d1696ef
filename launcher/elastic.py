"""One elastic policy: what the next attempt of an elastic job runs on.

A local pod (--min_processes, launcher/local/elastic.py), a TPU launch
(--min_slices, launcher/tpu/elastic.py) and a Ray job (--min_processes,
launcher/ray/elastic.py) each lose units of their own kind (a process, a
slice, a node). Each says what it has as a `Capacity`; `Policy.after`
decides, the same way for all three, after every attempt, and the job
agent (launcher/agent.py) reads the `Resize` that results.

Example:
  >>> policy = Policy(capacity, say=print)   # 4 processes, at least 3
  >>> policy.after(attempts.AttemptEnd(137, progressed=True, lost=(3,)))
  rank 3 lost (exit code 137): starting again at once on 3 of 4 ...
  Resize(kind=<Kind.SHRINK: 'shrink'>, wait_s=0.0)
"""

import dataclasses
import enum
from typing import Callable, Optional, Protocol

from launcher import attempts
from runtime.common import exit_codes
from runtime.common import records


class Kind(enum.StrEnum):
  """How the next attempt differs, as attempts.jsonl records it."""
  SHRINK = 'shrink'  # on the units left, at once
  GROW = 'grow'  # lost units are back
  WAIT = 'wait'  # too few left: wait until enough are back


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


@dataclasses.dataclass(frozen=True)
class Ready:
  """Before an attempt: whether the job can run again (truthy when it
  can), and what bringing its units back took, as goodput's
  infrastructure recovery (None when nothing had to come back, or the
  launcher does not time it)."""
  ok: bool
  infrastructure: Optional[records.Recreate] = None

  def __bool__(self) -> bool:
    return self.ok


class Capacity(Protocol):
  """What an elastic job can run on now, and what may come back.

  The job agent drives it the same way for every launcher: `Policy.after`
  calls `lose`, `take_back` and `waiting` after an attempt; the agent asks
  `grow_due` while an attempt runs (the attempt asks the agent); and it
  calls `ready` before every attempt after the first. `now` is
  time.monotonic().

  Attributes:
    minimum: the fewest units the job runs on.
    flag: the flag that sets `minimum`, as the user wrote it
      ('--min_processes', '--min_slices').
  """
  minimum: int
  flag: str

  def running(self) -> int:
    """The units the next attempt has now."""

  def describe(self) -> str:
    """What the next attempt runs on and what comes back, in words:
    '3 of 4 process(es), 1 coming back'."""

  def lose(self, end: attempts.AttemptEnd) -> str:
    """Takes what the attempt that ended so lost out
    of the next attempt (its `lost` processes' units, and any other unit
    seen gone); they may come back by themselves. Returns what was lost, in
    words: 'rank 3 lost (exit code 137)'."""

  def grow_due(self, now: float) -> bool:
    """Whether lost units are back, so that the running attempt should
    stop at a step boundary and the job grow."""

  def take_back(self) -> str:
    """Takes every unit that is back into the next attempt; returns what
    came back, in words: 'lost process(es) back'."""

  def waiting(self) -> tuple[float, str]:
    """With fewer than `minimum` units left, what the job waits for,
    changing nothing: (the seconds the launcher sleeps before the next
    attempt, in words). 0 s: the next attempt's `ready` does the
    waiting."""

  def ready(self, now: float) -> Ready:
    """Before every attempt after the first: takes in the units that are
    back, and waits while fewer than `minimum` are there. Not ready when
    they cannot come (the job ends)."""


@dataclasses.dataclass
class Policy:
  """The job agent's `resize` for every elastic launcher: after an attempt,
  GROW when it was stopped for units back, SHRINK onto the units left
  after a loss when they are at least `capacity.minimum`, else WAIT for
  enough to be back; None where the usual restart rules decide.

  Attributes:
    capacity: the launcher's units.
    say: how to tell the user what the next attempt does.
  """
  capacity: Capacity
  say: Callable[[str], None]

  def after(self, end: attempts.AttemptEnd) -> Optional[Resize]:
    """The next attempt's resize, given how one ended (its code, `regrew`,
    `progressed` and `lost`).

    A loss before any step completed is no lost host (a process that
    cannot start fails the same way on any number): None."""
    capacity = self.capacity
    if end.regrew and end.code == exit_codes.PREEMPTED:
      back = capacity.take_back()
      self.say(f'{back}: starting again at once on {capacity.describe()}, '
               'from the step every process saved')
      return Resize(GROW)
    if not (end.lost and end.progressed):
      return None
    lost = capacity.lose(end)
    if capacity.running() >= capacity.minimum:
      self.say(f'{lost}: starting again at once on {capacity.describe()}, '
               'the same global batch on fewer devices')
      return Resize(SHRINK)
    left = capacity.running()
    wait_s, waiting = capacity.waiting()
    self.say(f'{lost}: {left} left, fewer than {capacity.flag}='
             f'{capacity.minimum}; {waiting}')
    return Resize(WAIT, wait_s)
