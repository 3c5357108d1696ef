"""TensorBoard event files of a run's scalars, without TensorFlow.

Built and written with tensorboardX's protos and record writer, whose only
dependencies are numpy and protobuf, on the caller's thread:
tensorboardX's SummaryWriter queues events for a thread of its own, and its
flush() does not wait for that queue, so a SIGKILL lost every event still
queued (measured: a run killed after step 70 lost 60 to 70 from TensorBoard
although its local checkpoint of step 60 was complete). Here `flush` hands
every event written so far to the OS.

`tensorboard --logdir WORKDIR` shows the run; a resumed run writes a new
event file that tells TensorBoard to drop what the earlier one logged after
the checkpoint, so every step appears once.
"""

import math
import numbers
import os
import time
from typing import Any, Optional

from runtime.common import layout


class EventWriter:
  """Scalars to event files in WORKDIR/tensorboard.

  Example:
    >>> writer = EventWriter(layout.Record('/tmp/w'))
    >>> writer.scalars(100, {'loss': 0.25, 'learning_rate': 1e-3})
    >>> writer.flush()   # on disk for the OS: a SIGKILL cannot lose them
    >>> writer.close()
  """

  def __init__(self, record: layout.Record, resume_step: Optional[int] = None):
    # Imported here: only process 0 writes, and the import costs ~0.3 s.
    from tensorboardX import event_file_writer  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import summary_pb2  # pylint: disable=g-import-not-at-top
    self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
    self.logdir = record.tensorboard()
    os.makedirs(self.logdir, exist_ok=True)
    # File names start with the second the file was opened; two writers in
    # one second would share a name and the second would overwrite the
    # first. The nanoseconds keep them apart and in order.
    self._writer = event_file_writer.EventsWriter(
        os.path.join(self.logdir, 'events'), f'.{time.time_ns()}')
    if resume_step is not None:
      # TensorBoard drops the steps from here on that earlier files logged.
      purge = resume_step + 1
      self._writer.write_event(
          event_pb2.Event(step=purge,
                          wall_time=time.time(),
                          file_version='brain.Event:2'))
      self._writer.write_event(
          event_pb2.Event(step=purge,
                          wall_time=time.time(),
                          session_log=event_pb2.SessionLog(
                              status=event_pb2.SessionLog.START)))
    self.flush()

  def scalars(self, step: int, record: dict[str, Any]) -> None:
    """Writes every finite number of `record` as a scalar at `step`."""
    values = [
        self._summary_pb2.Summary.Value(tag=name, simple_value=float(value))
        for name, value in record.items()
        if not isinstance(value, bool) and isinstance(value, numbers.Real) and
        math.isfinite(value)
    ]
    if values:
      self._writer.write_event(
          self._event_pb2.Event(
              step=step,
              wall_time=time.time(),
              summary=self._summary_pb2.Summary(value=values)))

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()
