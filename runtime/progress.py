"""Tells a supervising launcher how far this process has got.

The local-pod launcher passes a pipe in PODRUN_PROGRESS_FD; its hang watchdog
counts time from the last step any rank completed. Without a supervisor this
module does nothing. Reports are throttled, so a fast loop costs at most one
small write a second.
"""

import os
import time

PROGRESS_FD_ENV = 'PODRUN_PROGRESS_FD'
_MIN_INTERVAL_S = 1.0


class _Reporter:

  def __init__(self):
    fd = os.environ.get(PROGRESS_FD_ENV)
    self._fd = int(fd) if fd else None
    self._last_time = None

  def report(self, step: int, process_index: int, force: bool) -> None:
    if self._fd is None:
      return
    now = time.monotonic()
    if (not force and self._last_time is not None and
        now - self._last_time < _MIN_INTERVAL_S):
      return
    self._last_time = now
    try:
      # One write below PIPE_BUF is atomic, so ranks may share the pipe.
      os.write(self._fd, f'{process_index} {step}\n'.encode())
    except OSError:
      self._fd = None  # The supervisor is gone; keep training.


_reporter = None


def report(step: int, process_index: int, force: bool = False) -> None:
  """Reports that `step` is complete on this process.

  Reports come at most once a second unless `force` is set (for the last
  step, so that the watchdog's clock stops where the work stops).

  Example:
    >>> progress.report(step, jax.process_index())
  """
  global _reporter
  if _reporter is None:
    _reporter = _Reporter()
  _reporter.report(step, process_index, force)
