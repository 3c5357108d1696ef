"""When the local tier saves: every N steps, or every N seconds of training.

By default (config.local_checkpoint_every unset) the interval between
copies is chosen from what a hard failure costs (`interval`): Daly's
interval, sqrt(2 C (M + R)) - C, for a copy that blocks the loop C seconds,
a restore of R seconds and a mean time between failures M (the job's own,
from the ledgers of its earlier attempts, else DEFAULT_MTBF_S), at most
CEILING_S; but never so short that the loop's blocking exceeds
BLOCKING_SHARE (2 %) of its time, nor under DEFAULT_EVERY_STEPS steps. The
first copy comes at step DEFAULT_EVERY_STEPS, where C is first measured.
C is what the loop waited for the
copy, less the steps it drained (device work it would have waited for
anyway) and any compilation (the copy's program, once). Process 0 says
the interval and why once, and in its ledger (`local_interval`).

config.local_checkpoint_every, set, counts steps as asked (every process
copies the same steps) and warns once when a copy blocks more than the
share (and at least 50 ms). config.local_checkpoint_every_s, when above 0,
counts seconds instead, within the same share.

After the warm-up (seconds), or after every copy (seconds, and the
default), process 0 turns the seconds into a number of steps from the recent
step time and tells the others, so that every process copies the same step
(a restore then finds every copy local: runtime/checkpoints/recovery.py).

Example:
  >>> cadence = Cadence(every_steps=0, every_s=30.0,
  ...                   client=coordination.current())
  >>> if cadence.due(run.step, run.count):
  ...   ...                                 # the copy, blocking_s long
  ...   cadence.saved(run.step, blocking_s)
"""

import math
from typing import Callable, Optional

from absl import logging
import numpy as np

from runtime.common import copy_interval
from runtime.common import progress
from runtime import coordination

BLOCKING_SHARE = copy_interval.BLOCKING_SHARE
# The default cadence's shortest interval, in steps, and its unit.
DEFAULT_EVERY_STEPS = 25
DEFAULT_MTBF_S = copy_interval.DEFAULT_MTBF_S
CEILING_S = copy_interval.CEILING_S
Interval = copy_interval.Interval
interval = copy_interval.interval
# A copy that blocks less is not worth a warning, whatever its share (a
# small model's steps of a few ms on a laptop).
_WARN_FROM_S = 0.05
_NEXT_KEY = 'podrun/local_tier_next/{}'


def recent_step_s(last: Optional[int] = None) -> Optional[float]:
  """The median of this process's recent step intervals (the newest `last`
  of them where given), None before any."""
  seconds = progress.snapshot().step_seconds
  if last:
    seconds = seconds[-last:]
  return float(np.median(seconds)) if seconds else None


def steps_between(every_s: float, step_s: Optional[float],
                  blocking_s: float) -> int:
  """Steps from one copy to the next, at least 1.

  Args:
    every_s: the seconds asked for.
    step_s: the recent step time (None: unknown, one step).
    blocking_s: what the last copy blocked the loop (0 before the first).

  Example:
    >>> steps_between(30.0, step_s=0.5, blocking_s=1.0)  # 2 % needs 50 s
    100
  """
  interval_s = max(every_s, blocking_s / BLOCKING_SHARE)
  return max(1, math.ceil(interval_s / max(step_s or interval_s, 1e-9)))


def _multiple_from(step: int, every: int) -> int:
  """The first multiple of `every` at or after `step`."""
  return -(-step // every) * every


class Cadence:
  """Decides, every step, whether this is a step the local tier copies.

  Every process must call `due` at every step and `saved` after every copy,
  in the same order: with a cadence in seconds these are the rounds in
  which process 0 tells the others the next step.
  """

  def __init__(self,
               every_steps: int = 0,
               every_s: float = 0.0,
               client: Optional[coordination.Client] = None,
               step_s: Callable[[], Optional[float]] = recent_step_s,
               budgeted: bool = False):
    self.every_steps, self.every_s = every_steps, every_s
    self.client, self._step_s = client, step_s
    # Every `every_steps` steps at the soonest, within BLOCKING_SHARE.
    self.budgeted = budgeted and every_steps > 0 and every_s <= 0
    self.next_step: Optional[int] = None
    self.blocking_s = 0.0
    self._warned = False
    # What a hard failure costs (`knows_fault_cost`), for the default's
    # interval; the interval last chosen, on process 0.
    self.restore_s, self.mtbf_s, self.mtbf_source = 0.0, DEFAULT_MTBF_S, (
        'default')
    self.chosen: Optional[Interval] = None
    self.on_chosen: Optional[Callable[[Interval], None]] = None

  def knows_fault_cost(self, restore_s: float, mtbf_s: Optional[float],
                       mtbf_source: str) -> None:
    """The restore's seconds and the job's mean time between failures
    (None: DEFAULT_MTBF_S), for the default cadence's interval."""
    self.restore_s = restore_s
    if mtbf_s is not None:
      self.mtbf_s, self.mtbf_source = mtbf_s, mtbf_source

  @property
  def enabled(self) -> bool:
    return self.every_steps > 0 or self.every_s > 0

  @property
  def in_seconds(self) -> bool:
    return self.every_s > 0

  def due(self, step: int, count: int) -> bool:
    """Whether to copy after `step`, the `count`-th step of this process
    (or the last of the steps of its call: `step` need not be consecutive)."""
    if self.budgeted:
      if self.next_step is None:
        self.next_step = _multiple_from(step, self.every_steps)
      return step >= self.next_step
    if not self.in_seconds:
      return self.every_steps > 0 and step % self.every_steps == 0
    if count < progress.WARMUP_STEPS:
      return False  # Its step times say nothing yet.
    if self.next_step is None:
      self.next_step = self._agree(step)
    return step >= self.next_step

  def saved(self, step: int, blocking_s: float) -> None:
    """A copy of `step` blocked the loop `blocking_s`: plans the next."""
    self.blocking_s = blocking_s
    if self.in_seconds or self.budgeted:
      self.next_step = self._agree(step)
      return
    step_s = self._step_s()
    if (not self._warned and step_s and blocking_s >= _WARN_FROM_S and
        blocking_s > BLOCKING_SHARE * self.every_steps * step_s):
      # Steps are what was asked for: every process must copy the same
      # ones, so the cadence stays; the user is told how to bound it.
      self._warned = True
      logging.warning(
          'a local copy blocks the loop %.3f s, %.1f %% of the %d steps '
          '(%.3f s) between copies; config.local_checkpoint_every_s=%g keeps '
          'it under %g %% (or leave local_checkpoint_every unset: every '
          '%d steps within that share)', blocking_s,
          100 * blocking_s / (self.every_steps * step_s),
          self.every_steps, self.every_steps * step_s,
          math.ceil(self.every_steps * step_s), 100 * BLOCKING_SHARE,
          DEFAULT_EVERY_STEPS)

  def _choose(self, chosen: Interval) -> None:
    """Keeps `chosen`; says it the first time, and when it moves by half."""
    before, self.chosen = self.chosen, chosen
    if before is None or not (0.5 * before.seconds < chosen.seconds <
                              2 * before.seconds):
      logging.info('local copies about every %.1f s of training: %s',
                   chosen.seconds, chosen.why)
    if self.on_chosen is not None:
      self.on_chosen(chosen)

  def _agree(self, step: int) -> int:

    def decide() -> str:
      if self.budgeted:
        # The interval a fault's cost chooses, and at least the unit after
        # the step this copy was for (`next_step`: a call may have passed
        # it). Any step will do: a call copies at its first step past it.
        chosen = interval(self.blocking_s, self.restore_s, self.mtbf_s,
                          self.mtbf_source)
        self._choose(chosen)
        between = steps_between(chosen.seconds, self._step_s(), 0.0)
        assert self.next_step is not None  # A budgeted `due` set it.
        return str(max(self.next_step + self.every_steps, step + between))
      return str(step +
                 steps_between(self.every_s, self._step_s(), self.blocking_s))

    if self.client is None:
      return int(decide())
    return int(self.client.from_0(_NEXT_KEY.format(step), decide))
