"""Data sources for the worker processes' tests (tests/test_readers.py):
module-level, so that they pickle to spawned workers."""

import os

import numpy as np


class Records:
  """Record i: {'x': (3,) float32 of i, 'label': int32 i}; record `raises`
  raises, and reading record `dies` ends the worker with exit 9."""

  def __init__(self, size: int, raises: int = -1, dies: int = -1):
    self.size, self.raises, self.dies = size, raises, dies

  def __len__(self):
    return self.size

  def __getitem__(self, index):
    if index == self.raises:
      raise ValueError(f'record {index} is corrupt')
    if index == self.dies:
      os._exit(9)  # pylint: disable=protected-access
    return {'x': np.full(3, index, np.float32), 'label': np.int32(index)}
