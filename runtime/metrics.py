"""Where a run's numbers go: the log, WORKDIR/metrics.jsonl, TensorBoard event
files in WORKDIR/tensorboard and summary files.

Only process 0 writes job-wide files (metrics.jsonl, summary.json); every
process writes its own ranks/rank_<i>.json, so that all of them can be
compared afterwards.
"""

import collections
import json
import os
from typing import Any, Callable, NamedTuple, Optional, TextIO

from absl import logging
import numpy as np

from runtime.common import files
from runtime.common import layout
from runtime import tensorboard

# Kept here too: workloads write their own JSON with them.
to_json = files.to_json
write_json = files.write_json


def format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


def keep_records_up_to(path: str, step: int) -> int:
  """Drops the records after `step` from a metrics.jsonl; returns how many.

  A run killed after its last checkpoint logged steps that the resumed run
  will log again; dropping them keeps one record per step. A torn last line
  (a write cut short) is dropped too.
  """
  if not os.path.exists(path):
    return 0
  kept, dropped = [], 0
  with open(path) as f:
    for line in f:
      try:
        record_step = json.loads(line)['step']
      except (ValueError, KeyError, TypeError):
        dropped += 1
        continue
      if record_step <= step:
        kept.append(line if line.endswith('\n') else line + '\n')
      else:
        dropped += 1
  files.write_atomic(path, ''.join(kept))
  return dropped


class MetricsWriter:
  """Logs metrics and appends them to WORKDIR/metrics.jsonl on process 0.

  Every number also goes to TensorBoard event files (runtime/tensorboard.py)
  unless `tensorboard` is False. A fresh run starts the file anew; a run
  resumed at step s keeps the records up to s and appends after them.

  Example:
    >>> writer = MetricsWriter(record, is_process_0=jax.process_index() == 0)
    >>> writer.write(100, {'loss': 0.1, 'steps_per_sec': 50.0})
  """

  def __init__(self,
               record: layout.Record,
               is_process_0: bool,
               resume_step: Optional[int] = None,
               tensorboard_events=True,
               fields: Optional[dict[str, Any]] = None):
    self.is_process_0 = is_process_0
    # On every row, in TensorBoard too: a resume on another topology shows.
    self.fields = dict(fields or {})
    self._file: Optional[TextIO] = None
    self._events: Optional[tensorboard.EventWriter] = None
    if is_process_0 and tensorboard_events:
      self._events = tensorboard.EventWriter(record, resume_step)
    if is_process_0:
      os.makedirs(record.workdir, exist_ok=True)
      path = record.metrics()
      if resume_step is None:
        self._file = open(path, 'w')
      else:
        dropped = keep_records_up_to(path, resume_step)
        if dropped:
          logging.info(
              'dropped %d records after step %d from %s; they are '
              'logged again from the checkpoint', dropped, resume_step, path)
        self._file = open(path, 'a')

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    if not self.is_process_0:
      return
    if self._file is None:
      raise ValueError(f'metrics of step {step} written after close')
    values = {**to_json(metrics), **self.fields}
    self._file.write(json.dumps({'step': step, **values}) + '\n')
    self._file.flush()
    if self._events is not None:
      self._events.scalars(step, values)

  def flush(self) -> None:
    """Hands every record written so far to the OS (TensorBoard's event
    file buffers them otherwise), where a SIGKILL cannot lose them."""
    if self._events is not None:
      self._events.flush()

  def log(self, message: str) -> None:
    if self.is_process_0:
      logging.info(message)

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._events is not None:
      self._events.close()
      self._events = None


# The shortest span, in seconds of steps, a line's rates are measured over.
# A window of one short call is timed by when the host got to its result:
# on a TPU v5e, 100 steps of a linear regression in a 2-ms call gave lines
# from 7 k to 73 k steps/s (issue 85). Over a second, that jitter is a few
# parts in a thousand.
RATE_SPAN_S = 1.0


class _Mark(NamedTuple):
  """Where the run stood when a call retired: its time, and the timed
  steps, the pauses and the input wait so far."""
  time: float
  steps: int
  paused: float
  waited: float

  def seconds_to(self, later: '_Mark') -> float:
    """The wall time to a later mark less the pauses between."""
    return (later.time - self.time) - (later.paused - self.paused)


class Window:
  """Means of the metrics since the last log line, the speed, the input wait.

  The speed is the pace of the steps: the steps over the wall time less the
  loop thread's own pauses meanwhile (`paused`: a compilation in that
  thread, a checkpoint's or a local copy's blocking, an evaluation:
  goodput.StepClock.paused_here). It is measured from the last line, or,
  where the steps since then took less than `span_s`, from the latest
  earlier call that makes the span that long (or the first timed one): a
  window of a few short calls would otherwise give the host's jitter
  rather than the device's pace. The wait for input stays in (with the
  data set on the device it is the device's queue), but for a new
  program's first batch (`waited`); input_wait_fraction gives its share of
  the same span. A line whose window held a compile or a save then gives
  the pace of the others (issue 85). The run's first call is left out
  (start-up).
  """

  def __init__(self,
               paused: Callable[[], float] = lambda: 0.0,
               span_s: float = RATE_SPAN_S):
    self._paused = paused
    self._span_s = span_s
    self.timing = False
    # A mark per call retired since the earliest span's start.
    self._marks: collections.deque[_Mark] = collections.deque()
    self._timed_total, self._wait_total, self._skipped = 0, 0.0, 0.0
    self.reset()

  def reset(self) -> None:
    """Starts the next line's window: its means and its own steps. The
    marks stay, since the next line's span may reach back before it."""
    self.steps = 0
    self.sums: dict[str, float] = collections.defaultdict(float)
    self.timed_steps = 0
    self._line_start = self._marks[-1] if self._marks else None

  def waited(self, seconds: float, new_program: bool = False) -> None:
    """The loop waited `seconds` for a call's batch. For the first call of
    a program (a new steps-per-call size) that wait is a pause: the
    prefetch thread compiled the new size's batch gather meanwhile, half a
    second on a TPU v5e, which read as a line of a few hundred steps/s
    among lines of ten thousand (issue 85)."""
    if not self.timing:
      return
    if new_program:
      self._skipped += seconds
    else:
      self._wait_total += seconds

  def add(self, stacked: dict[str, np.ndarray], steps: int, now: float) -> None:
    """`steps` steps retired at `now`, with their metrics stacked
    ({name: (steps,)})."""
    self.steps += steps
    for k, v in stacked.items():
      total = self.sums[k]
      for x in v.tolist():  # In step order, as the log's means always were.
        total += x
      self.sums[k] = total
    if self.timing:
      self.timed_steps += steps
      self._timed_total += steps
    else:  # The run's first call: start-up and compilation; time from its end.
      self.timing = True
    self._marks.append(
        _Mark(now, self._timed_total,
              self._paused() + self._skipped, self._wait_total))
    if self._line_start is None:
      self._line_start = self._marks[-1]
    # Marks no span can start from any more: the one after already spans
    # enough, and spans only grow as time goes on.
    while (len(self._marks) > 2 and
           self._marks[1].seconds_to(self._marks[-1]) >= self._span_s):
      self._marks.popleft()

  def means(self) -> dict[str, float]:
    return {k: v / self.steps for k, v in self.sums.items()}

  def rates(self, global_batch_size: int) -> dict[str, float]:
    """steps_per_sec, examples_per_sec, input_wait_fraction up to the last
    call retired; {} before a timed step."""
    if not self.timed_steps:
      return {}
    end = self._marks[-1]
    start = self._line_start
    if start is None or start.seconds_to(end) < self._span_s:
      # The latest mark that spans enough, or the first timed one: the
      # marks before it were dropped in `add`.
      start = self._marks[0]
    elapsed = max(start.seconds_to(end), 1e-9)
    steps = end.steps - start.steps
    return {
        'steps_per_sec': steps / elapsed,
        'examples_per_sec': steps / elapsed * global_batch_size,
        'input_wait_fraction': min((end.waited - start.waited) / elapsed, 1.0)
    }
