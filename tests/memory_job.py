"""A coordination service in a dict, shared by threads that play processes.

`MemoryJob` has the methods of `runtime.coordination.Client` that the rounds
and the supervisor use, so both run in one test process without JAX.

Example:
  >>> store = MemoryStore()
  >>> jobs = [MemoryJob(i, 3, store) for i in range(3)]
"""

import threading
import time
from typing import Optional

from runtime import coordination


class MemoryStore:
  """The key-value store and barrier marks that several jobs share."""

  def __init__(self):
    self.values: dict[str, str] = {}
    self.changed = threading.Condition()


class MemoryJob(coordination.Rounds):
  """One process's handle on a `MemoryStore`."""

  def __init__(self,
               process_index: int = 0,
               process_count: int = 2,
               store: Optional[MemoryStore] = None):
    self.process_index, self.process_count = process_index, process_count
    self._shared = store or MemoryStore()
    self.store = self._shared.values
    self.changed = self._shared.changed

  def set(self, key, value, overwrite=False):
    with self.changed:
      if key in self.store and not overwrite:
        return False
      self.store[key] = value
      self.changed.notify_all()
      return True

  def get(self, key):
    return self.store.get(key)

  def wait(self, key, timeout_s):
    with self.changed:
      self.changed.wait_for(lambda: key in self.store, timeout_s)
      return self.store.get(key)

  def delete(self, key):
    with self.changed:
      for k in [k for k in self.store if k == key or k.startswith(key + '/')]:
        del self.store[k]

  def directory(self, prefix):
    prefix = prefix.rstrip('/') + '/'
    with self.changed:
      return {k: v for k, v in self.store.items() if k.startswith(prefix)}

  def barrier(self, name, timeout_s=None):
    timeout_s = coordination.default_timeout() if timeout_s is None else (
        timeout_s)
    self.publish(f'{name}/arrived', str(time.time()))
    with self.changed:
      everyone = self.changed.wait_for(
          lambda: len(self.by_process(f'{name}/arrived')) == self.process_count,
          timeout_s)
    if not everyone:
      arrived = self.by_process(f'{name}/arrived')
      raise coordination.BarrierTimeout(
          name, [r for r in range(self.process_count) if r not in arrived],
          timeout_s, self.process_count)
