"""TensorBoard event files of a run's scalars, without TensorFlow.

Written with tensorboardX, whose only dependencies are numpy and protobuf.
`tensorboard --logdir WORKDIR` shows the run; a resumed run writes a new
event file that tells TensorBoard to drop what the earlier one logged after
the checkpoint, so every step appears once.
"""

import math
import numbers
import os
import time
from typing import Any, Optional

SUBDIR = 'tensorboard'


class EventWriter:
  """Scalars to event files in WORKDIR/tensorboard.

  Example:
    >>> writer = EventWriter('/tmp/w')
    >>> writer.scalars(100, {'loss': 0.25, 'learning_rate': 1e-3})
    >>> writer.close()
  """

  def __init__(self, workdir: str, resume_step: Optional[int] = None):
    # Imported here: only process 0 writes, and the import costs ~0.3 s.
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self.logdir = os.path.join(workdir, SUBDIR)
    # File names start with the second the file was opened; two writers in
    # one second would share a name and the second would overwrite the
    # first. The nanoseconds keep them apart and in order.
    self._writer = SummaryWriter(
        self.logdir, flush_secs=10, filename_suffix=f'.{time.time_ns()}',
        purge_step=None if resume_step is None else resume_step + 1)

  def scalars(self, step: int, record: dict[str, Any]) -> None:
    """Writes every finite number of `record` as a scalar at `step`."""
    for name, value in record.items():
      if isinstance(value, bool) or not isinstance(value, numbers.Real):
        continue
      if math.isfinite(value):
        self._writer.add_scalar(name, float(value), step)

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()
