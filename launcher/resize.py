"""What the next attempt of an elastic job runs on: one `Resize`, for the
local pod (launcher/local/elastic.py) and the TPU driver
(launcher/tpu/elastic.py) alike, as restart.run's `resize` returns it.

Example:
  >>> Resize(SHRINK)            # on the processes or slices left, at once
  >>> Resize(WAIT, wait_s=20)   # too few left: wait until enough are back
"""

import dataclasses

# The kinds, as attempts.jsonl records them.
SHRINK = 'shrink'   # on the others, at once
GROW = 'grow'       # lost ones are back
WAIT = 'wait'       # too few left: wait until enough are back
KINDS = (SHRINK, GROW, WAIT)


@dataclasses.dataclass(frozen=True)
class Resize:
  """The next attempt runs on another number of processes or slices.

  Attributes:
    kind: SHRINK, GROW or WAIT.
    wait_s: how long to wait before that attempt starts.
  """
  kind: str
  wait_s: float = 0.0

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f'Resize kind {self.kind!r}; one of {KINDS}')
