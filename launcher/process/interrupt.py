"""SIGINT ends this process within a bounded time, even mid-collective.

Python runs signal handlers on the main thread between bytecodes. A main
thread blocked in a collective whose peer was SIGKILLed runs none until the
collective itself gives up: measured here, a 2x4 local pod's surviving rank
took 3.4 s to exit after the launcher's SIGINT, the largest part of the time
to recover from the failure.

The C-level handler writes every signal number to a wakeup fd at once,
whatever the main thread is doing, so a thread reading it sees SIGINT at
once. It gives the main thread `grace_s` to stop by itself (KeyboardInterrupt,
its ledger written), then flushes what this process has to say and exits
with 130, as a process killed by SIGINT does.

Example:
  >>> interrupt.install(grace_s=1.0, exit_process=supervisor.flush_and_exit)
"""

import os
import signal
import threading
import time
from typing import Callable

INTERRUPTED = 128 + signal.SIGINT


def install(grace_s: float, exit_process: Callable[[int], None]) -> None:
  """Watches for SIGINT from now on; call from the main thread.

  Args:
    grace_s: how long the main thread has to stop by itself.
    exit_process: ends the process with the code it is given.
  """
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)
  signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
  threading.Thread(target=_watch,
                   args=(read_fd, grace_s, exit_process),
                   name='sigint-watch',
                   daemon=True).start()


def _watch(read_fd: int, grace_s: float, exit_process: Callable[[int],
                                                                None]) -> None:
  while True:
    numbers = os.read(read_fd, 64)
    if not numbers:
      return
    if signal.SIGINT in numbers:
      time.sleep(grace_s)
      exit_process(INTERRUPTED)
      return
