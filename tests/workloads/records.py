"""Data sources for the worker processes' tests (tests/test_readers.py):
module-level, so that they pickle to spawned workers."""

import os
import time

import numpy as np


class Records:
  """Record i: {'x': (3,) float32 of i, 'label': int32 i}; record `raises`
  raises, reading record `dies` ends the worker with exit 9, and every
  record waits `record_s` first."""

  def __init__(self,
               size: int,
               raises: int = -1,
               dies: int = -1,
               record_s: float = 0.0):
    self.size, self.raises, self.dies = size, raises, dies
    self.record_s = record_s

  def __len__(self):
    return self.size

  def __getitem__(self, index):
    if self.record_s:
      time.sleep(self.record_s)
    if index == self.raises:
      raise ValueError(f'record {index} is corrupt')
    if index == self.dies:
      os._exit(9)  # pylint: disable=protected-access
    return {'x': np.full(3, index, np.float32), 'label': np.int32(index)}


class Arrays:
  """Arrays read record by record, each waiting `record_s`: a data set
  whose records cost host time."""

  def __init__(self, arrays: dict, record_s: float):
    self.arrays, self.record_s = arrays, record_s

  def __len__(self):
    return len(next(iter(self.arrays.values())))

  def __getitem__(self, index):
    time.sleep(self.record_s)
    return {name: a[index] for name, a in self.arrays.items()}
