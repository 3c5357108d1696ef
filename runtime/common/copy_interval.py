"""How often the local tier copies, from what a hard failure costs: the rule
alone, JAX-free, for the runtime's cadence (runtime/checkpoints/
local_cadence.py) and for `podrun-goodput`'s advice from a job's history.

Daly's interval, sqrt(2 C (M + R)) - C, minimises the expected time lost to
copies and to recomputed steps for a copy that blocks the loop C seconds, a
restore of R seconds and a mean time between failures M (Young's is the
first term). It is taken at most CEILING_S, and never under what keeps the
copies' blocking within BLOCKING_SHARE of the loop's time.

Example:
  >>> interval(0.01, 5.0, 3600.0).seconds
  8.48...
"""

import dataclasses
import math
from typing import Any

# The share of the loop's time the copies may block it.
BLOCKING_SHARE = 0.02
# The mean time between hard failures assumed where the job's history has
# none: an hour, a large pod's order of magnitude.
DEFAULT_MTBF_S = 3600.0
# The longest interval the default cadence leaves between copies: at most
# this much training is recomputed after a hard failure, whatever M says.
CEILING_S = 60.0


@dataclasses.dataclass(frozen=True)
class Interval:
  """The default cadence's interval and what chose it.

  Attributes:
    seconds: the interval chosen.
    blocking_s: C, what one copy blocks the loop.
    restore_s: R, what a restore takes.
    mtbf_s: M, the mean time between failures used.
    mtbf_source: where M comes from ('default', or 'N failure(s) in S s of
      this job').
    daly_s: Daly's interval for C, R and M.
    budget_s: the shortest interval within BLOCKING_SHARE.
  """
  seconds: float
  blocking_s: float
  restore_s: float
  mtbf_s: float
  mtbf_source: str
  daly_s: float
  budget_s: float

  @property
  def why(self) -> str:
    if self.seconds == self.budget_s and self.budget_s > min(
        self.daly_s, CEILING_S):
      return (f'the {100 * BLOCKING_SHARE:g} % budget on the loop '
              f'(a copy blocks it {self.blocking_s:.3f} s)')
    if self.daly_s <= CEILING_S:
      return (f"Daly's interval for a copy blocking {self.blocking_s:.3f} s, "
              f'a restore of {self.restore_s:.1f} s and a mean of '
              f'{self.mtbf_s:.0f} s between failures ({self.mtbf_source})')
    return (f'the ceiling of {CEILING_S:g} s (Daly\'s interval, '
            f'{self.daly_s:.0f} s for a mean of {self.mtbf_s:.0f} s between '
            f'failures, is longer)')

  def as_dict(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), 'why': self.why}


def interval(blocking_s: float,
             restore_s: float,
             mtbf_s: float,
             mtbf_source: str = 'default') -> Interval:
  """The seconds between local copies for a copy blocking `blocking_s`, a
  restore of `restore_s` and a mean time between failures `mtbf_s`.

  Example:
    >>> interval(0.01, 5.0, 3600.0).seconds      # sqrt(2 x 0.01 x 3605)
    8.48...
    >>> interval(1.2, 5.0, 3600.0).seconds       # the budget: 1.2 / 0.02
    60.0
  """
  daly = max(
      math.sqrt(2 * blocking_s * (mtbf_s + restore_s)) - blocking_s, blocking_s)
  budget = blocking_s / BLOCKING_SHARE
  return Interval(seconds=max(budget, min(daly, CEILING_S)),
                  blocking_s=blocking_s,
                  restore_s=restore_s,
                  mtbf_s=mtbf_s,
                  mtbf_source=mtbf_source,
                  daly_s=daly,
                  budget_s=budget)
