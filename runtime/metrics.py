"""Where a run's numbers go: the log, WORKDIR/metrics.jsonl and summary files.

Only process 0 writes job-wide files (metrics.jsonl, summary.json); every
process writes its own ranks/rank_<i>.json, so that all of them can be
compared afterwards.
"""

import json
import math
import os
from typing import Any

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


class MetricsWriter:
  """Logs metrics and appends them to WORKDIR/metrics.jsonl on process 0.

  Example:
    >>> writer = MetricsWriter(workdir, is_chief=jax.process_index() == 0)
    >>> writer.write(100, {'loss': 0.1, 'steps_per_sec': 50.0})
  """

  def __init__(self, workdir: str, is_chief: bool):
    self.is_chief = is_chief
    self._file = None
    if is_chief:
      os.makedirs(workdir, exist_ok=True)
      self._file = open(os.path.join(workdir, 'metrics.jsonl'), 'w')

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
