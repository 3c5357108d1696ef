"""Signal handlers installed for a while, then the previous ones again.

Example:
  >>> with signals.handled((signal.SIGINT, signal.SIGTERM), on_signal):
  ...   supervise()
"""

import contextlib
import signal
from typing import Callable, Iterable, Iterator


@contextlib.contextmanager
def handled(signums: Iterable[int], handler: Callable) -> Iterator[None]:
  """Installs `handler` for each signal; restores the previous ones after."""
  previous = {s: signal.signal(s, handler) for s in signums}
  try:
    yield
  finally:
    for signum, old in previous.items():
      signal.signal(signum, old)
