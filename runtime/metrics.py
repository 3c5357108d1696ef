"""Where a run's numbers go: the log, WORKDIR/metrics.jsonl and summary files.

Only process 0 writes job-wide files (metrics.jsonl, summary.json); every
process writes its own ranks/rank_<i>.json, so that all of them can be
compared afterwards.
"""

import json
import math
import os
from typing import Any, Optional

from absl import logging
import numpy as np


def to_json(value: Any) -> Any:
  """Turns numpy and JAX scalars and arrays into plain JSON values."""
  if isinstance(value, dict):
    return {str(k): to_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_json(v) for v in value]
  if hasattr(value, 'shape') and hasattr(value, 'dtype'):
    value = np.asarray(value)
    return value.item() if value.ndim == 0 else value.tolist()
  if isinstance(value, float) and not math.isfinite(value):
    return repr(value)
  return value


def write_json(path: str, value: Any) -> None:
  """Writes JSON through a temporary file, so readers never see half of it."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    json.dump(to_json(value), f, indent=2, sort_keys=True)
    f.write('\n')
  os.replace(tmp, path)


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
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.writelines(kept)
  os.replace(tmp, path)
  return dropped


class MetricsWriter:
  """Logs metrics and appends them to WORKDIR/metrics.jsonl on process 0.

  A fresh run starts the file anew; a run resumed at step s keeps the records
  up to s and appends after them.

  Example:
    >>> writer = MetricsWriter(workdir, is_chief=jax.process_index() == 0)
    >>> writer.write(100, {'loss': 0.1, 'steps_per_sec': 50.0})
  """

  def __init__(self, workdir: str, is_chief: bool,
               resume_step: Optional[int] = None):
    self.is_chief = is_chief
    self._file = None
    if is_chief:
      os.makedirs(workdir, exist_ok=True)
      path = os.path.join(workdir, 'metrics.jsonl')
      if resume_step is None:
        self._file = open(path, 'w')
      else:
        dropped = keep_records_up_to(path, resume_step)
        if dropped:
          logging.info('dropped %d records after step %d from %s; they are '
                       'logged again from the checkpoint', dropped,
                       resume_step, path)
        self._file = open(path, 'a')

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    if not self.is_chief:
      return
    record = {'step': step, **to_json(metrics)}
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()

  def log(self, message: str) -> None:
    if self.is_chief:
      logging.info(message)

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
