"""What a data worker process runs (runtime/readers.py): JAX-free, so that a
spawned worker starts in the time its source's own imports take.

Example:
  >>> start(source)                 # once, the pool's initializer
  >>> read(np.array([4, 9, 2]))     # {'x': (3, ...), ...}
"""

import traceback
from typing import Any

import numpy as np


class RecordFailed(Exception):
  """A record's read raised in a worker: its index and the traceback."""

  def __init__(self, index: int, trace: str):
    super().__init__(index, trace)
    self.index, self.trace = index, trace


_source: Any = None


def start(source: Any) -> None:
  """The worker's source, given once."""
  global _source
  _source = source


def stacked(examples: list) -> Any:
  """Examples (pytrees of dicts, lists and tuples of arrays) stacked leaf by
  leaf on a new first axis."""
  first = examples[0]
  if isinstance(first, dict):
    return {k: stacked([e[k] for e in examples]) for k in first}
  if isinstance(first, (list, tuple)):
    return type(first)(
        stacked([e[i] for e in examples]) for i in range(len(first)))
  return np.stack([np.asarray(e) for e in examples])


def read(ids: np.ndarray) -> Any:
  """The records `ids`, stacked (each leaf (len(ids), ...)).

  Raises:
    RecordFailed: the index of the record that raised, with the traceback
      (the first of the run where the source reads whole batches).
  """
  if callable(getattr(_source, 'read_batch', None)):
    try:
      return _source.read_batch(ids)
    except Exception:  # pylint: disable=broad-except
      raise RecordFailed(int(ids[0]), traceback.format_exc()) from None
  examples = []
  for i in ids:
    try:
      examples.append(_source[int(i)])
    except Exception:  # pylint: disable=broad-except
      raise RecordFailed(int(i), traceback.format_exc()) from None
  return stacked(examples)
