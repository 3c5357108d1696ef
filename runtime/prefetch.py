"""Prepares the batches of the next steps while the current step runs.

A background thread reads each step's examples, splits them over the devices
and copies them to the devices, up to `size` steps ahead. The training loop
then only takes a ready batch; the time it still has to wait is what
`input_wait_fraction` reports.
"""

import queue
import threading
import time
from typing import Any, Callable, Generic, Iterable, Optional, TypeVar

# What names a batch: a step, or a call's (first step, steps).
Key = TypeVar('Key')


class Prefetcher(Generic[Key]):
  """Runs `make_batch(step)` for `steps`, in order, ahead of the consumer.

  Args:
    make_batch: step (or any key that names a batch) -> batch on the
      devices.
    steps: the keys to prepare, in the order they will be taken.
    size: how many prepared batches may wait (each holds device memory).

  Example:
    >>> with Prefetcher(load, range(start, steps)) as batches:
    ...   for step in range(start, steps):
    ...     batch, waited_s = batches.next(step)
  """

  def __init__(self,
               make_batch: Callable[[Key], Any],
               steps: Iterable[Key],
               size: int = 2):
    if size < 1:
      raise ValueError(f'prefetch size {size}; it must be at least 1')
    self._make_batch = make_batch
    self._ready: queue.Queue = queue.Queue(maxsize=size)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._fill,
                                    args=(iter(steps),),
                                    name='podrun-prefetch',
                                    daemon=True)
    self._thread.start()

  def _fill(self, steps) -> None:
    for step in steps:
      item: tuple[Any, Any, Optional[BaseException]]
      try:
        item = (step, self._make_batch(step), None)
      except BaseException as e:  # Re-raised in the consumer's thread.
        item = (step, None, e)
      while not self._stop.is_set():
        try:
          self._ready.put(item, timeout=0.1)
          break
        except queue.Full:
          continue
      if self._stop.is_set() or item[2] is not None:
        return

  def next(self, step: Key) -> tuple[Any, float]:
    """The batch of `step` and the seconds spent waiting for it.

    Raises:
      whatever make_batch raised for this step.
    """
    got, batch, waited = self._take(f'step {step}')
    if got != step:
      raise AssertionError(f'prefetched the batch of step {got}, but step '
                           f'{step} asked for one')
    return batch, waited

  def take(self) -> tuple[Key, Any, float]:
    """(the next key, its batch, the seconds spent waiting for it), for a
    consumer that learns the keys from the batches.

    Raises:
      whatever make_batch raised for that key; AssertionError once the
      keys have run out.
    """
    return self._take('the next batch')

  def _take(self, asked: str) -> tuple[Key, Any, float]:
    started = time.perf_counter()
    while True:
      try:
        got, batch, error = self._ready.get(timeout=0.5)
        break
      except queue.Empty:
        if not self._thread.is_alive() and self._ready.empty():
          raise AssertionError(f'{asked} asked for a batch after the '
                               'last prepared one') from None
    waited = time.perf_counter() - started
    if error is not None:
      raise error
    return got, batch, waited

  def close(self) -> None:
    """Stops preparing batches and drops the ones not taken."""
    self._stop.set()
    while self._thread.is_alive():
      try:
        self._ready.get_nowait()
      except queue.Empty:
        pass
      self._thread.join(timeout=0.05)

  def __enter__(self) -> 'Prefetcher':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
