"""A local pod's output: every rank's lines filed and echoed, its progress read.

Each rank's stdout and stderr go whole to WORKDIR/logs/rank_<i>.log and, with
a `[rank i/N]` prefix, to the console: rank 0 in full, other ranks' warnings
and errors (launcher/common/output_prefix.py decides). Each rank reports its
completed steps as `RANK STEP` lines on one shared pipe.

Example:
  >>> console = Console(num_processes=2, log_all_ranks=False)
  >>> console.pump(rank, rank.popen.stderr, 'stderr', sys.stderr)
  >>> console.say('started 2 ranks')
"""

import os
import sys
import threading
import time
from typing import Optional

from launcher.local import members as members_lib
from launcher.common import output_prefix


class Console:
  """The launcher's console, shared by the threads that write to it."""

  def __init__(self, num_processes: int, log_all_ranks: bool):
    self.num_processes = num_processes
    self.log_all_ranks = log_all_ranks
    self._lock = threading.Lock()

  def say(self, message: str) -> None:
    """One `[launcher] ...` line on stderr."""
    with self._lock:
      print(f'[launcher] {message}', file=sys.stderr, flush=True)

  def pump(self, member: members_lib.Member, pipe, stream_name: str,
           console) -> None:
    """Copies one of the rank's pipes to its log and, filtered, to `console`.

    Returns at the pipe's end of file, when the rank has exited.
    """
    line_prefix = output_prefix.prefix(member.index, self.num_processes)
    log = member.log_file
    if log is None:
      raise AssertionError(f'rank {member.index} pumped before its log opened')
    for raw in iter(pipe.readline, b''):
      with member.log_lock:
        log.write(raw)
        log.flush()
      line = raw.decode('utf-8', 'replace')
      if output_prefix.shown_on_console(member.index, stream_name, line,
                                        self.log_all_ranks):
        with self._lock:
          console.write(line_prefix + line +
                        ('' if line.endswith('\n') else '\n'))
          console.flush()
    pipe.close()


class Progress:
  """The ranks' completed steps, read from the pipe they all write to.

  Attributes:
    last_advance: time.monotonic() when any rank last completed a step, or
      None before the first.
  """

  def __init__(self, members: list[members_lib.Member]):
    self._members = members
    self.last_advance: Optional[float] = None
    self.read_fd, self.write_fd = os.pipe()

  def read(self) -> None:
    """Reads `RANK STEP` lines until every rank has closed the pipe."""
    with os.fdopen(self.read_fd, 'rb') as pipe:
      for raw in pipe:
        try:
          index, step = (int(x) for x in raw.split())
          member = self._members[index]
        except (ValueError, IndexError):
          continue
        if step > member.step:
          member.step = step
          self.last_advance = time.monotonic()
