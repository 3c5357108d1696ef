"""A process's end written down however it ends: its obituary.

A process that JAX's coordination service aborts (SIGABRT, at once when a
peer, process 0 above all, dies), that crashes in C or that is SIGKILLed
runs none of its own code at the end: its goodput ledger would stop
without an end and its log without a cause. So every process, once its
ledger has a file, starts its obituary: a small child without JAX that

- holds the read end of the pipe Python's faulthandler writes a fatal
  signal's traceback to, and copies what comes to the process's stderr;
- waits for the process to exit (a pidfd), then, if the ledger holds no
  end, writes one: the exit code and cause the traceback shows (134
  aborted, 139 segmentation fault; else 137, killed without a trace), the
  fault for the time to recover (launcher/common/time_to_recover.py), the
  wall time of the end, and a line in the log saying so.

It runs in a session of its own and ignores SIGINT, SIGTERM and SIGHUP, so
that what stops the process's group does not stop it first, and exits once
it has written, or at once when the process wrote its own end.

Example:
  >>> obituary.start(ledger.path, process_index=1)   # in the process
"""

import faulthandler
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Optional

# What faulthandler prints first for each fatal signal, and the code a
# process killed by it exits with.
_FATAL = ((b'Fatal Python error: Aborted', 134,
           'aborted (SIGABRT): most likely by JAX\'s coordination service '
           'once another process of the job died (its "Terminating process" '
           'line above says)'),
          (b'Fatal Python error: Segmentation fault', 139,
           'a segmentation fault (SIGSEGV) in native code'),
          (b'Fatal Python error: Bus error', 135, 'a bus error (SIGBUS)'),
          (b'Fatal Python error: Floating point exception', 136,
           'a floating point exception (SIGFPE)'),
          (b'Fatal Python error: Illegal instruction', 132,
           'an illegal instruction (SIGILL)'))
_KILLED = (137, 'killed without a trace: SIGKILL (the OOM killer, a '
           'scheduler or a person) or the machine')
_traceback_file: list = [
]  # Kept open for as long as faulthandler writes to it.


def start(ledger_path: str, process_index: int) -> Optional[int]:
  """Starts this process's obituary; returns its pid (None where it cannot
  run: no pidfd on this system)."""
  if not hasattr(os, 'pidfd_open'):
    return None
  read_fd, write_fd = os.pipe()
  child = subprocess.Popen(
      [
          sys.executable, '-S',
          os.path.abspath(__file__),
          str(os.getpid()), ledger_path,
          str(read_fd),
          str(process_index)
      ],
      # A session of its own: what stops the process's group (the local
      # pod's sweep, a terminal's Ctrl-C) must not stop its obituary first.
      pass_fds=(read_fd,),
      stdin=subprocess.DEVNULL,
      start_new_session=True)
  os.close(read_fd)
  traceback_file = os.fdopen(write_fd, 'wb', buffering=0)
  _traceback_file.append(traceback_file)
  faulthandler.enable(file=traceback_file, all_threads=True)
  return child.pid


def classify(traceback: bytes) -> tuple[int, str]:
  """(exit code, cause) of a process that ended without writing its end,
  from what faulthandler wrote (b'' for nothing)."""
  for marker, code, cause in _FATAL:
    if marker in traceback:
      return code, cause
  return _KILLED


def record_end(ledger_path: str, process_index: int, ended: float,
               traceback: bytes) -> Optional[str]:
  """Writes the end into a ledger that has none; returns the cause, or None
  when the process wrote its own end (or has no ledger)."""
  try:
    with open(ledger_path) as f:
      ledger = json.load(f)
  except (OSError, ValueError):
    return None
  if ledger.get('final'):
    return None
  code, cause = classify(traceback)
  notes = ledger.setdefault('notes', {})
  notes.update(exit_code=code, cause=cause)
  if not notes.get('fault'):
    notes['fault'] = {
        'at': ended,
        'detected': ended,
        'rank': process_index,
        'kind': 'aborted' if code == 134 else 'killed',
        'exit_code': code
    }
  parts = ledger.setdefault('parts', {})
  parts['other'] = 0.0
  parts['other'] = max(
      0.0, ended - ledger.get('started', ended) - sum(parts.values()))
  ledger['updated'] = ended
  tmp = f'{ledger_path}.obituary'
  with open(tmp, 'w') as f:
    json.dump(ledger, f, indent=2, sort_keys=True)
  os.replace(tmp, ledger_path)
  return cause


def _watch(pid: int, read_fd: int) -> tuple[float, bytes]:
  """Copies the traceback pipe to stderr until process `pid` exits; returns
  when it did and what came through the pipe."""
  try:
    pidfd = os.pidfd_open(pid)
  except ProcessLookupError:
    raise
  except OSError:
    # Some sandboxes have no pidfd (ENOSYS; seen on a TPU VM's container):
    # `pid` started this process, so its end is when this one's parent
    # changes, looked at every half second.
    pidfd = None
  poller = select.poll()
  poller.register(read_fd, select.POLLIN)
  if pidfd is not None:
    poller.register(pidfd, select.POLLIN)
  traceback = bytearray()
  while True:
    ready = dict(poller.poll(None if pidfd is not None else 500))
    if read_fd in ready:
      data = os.read(read_fd, 65536)
      if data:
        traceback += data
        os.write(2, data)
      else:
        poller.unregister(read_fd)
    if (pidfd in ready if pidfd is not None else os.getppid() != pid):
      ended = time.time()
      os.set_blocking(read_fd, False)
      try:
        while data := os.read(read_fd, 65536):
          traceback += data
          os.write(2, data)
      except (BlockingIOError, OSError):
        pass
      return ended, bytes(traceback)


def main(argv: list[str]) -> int:
  pid, ledger_path, read_fd, process_index = (int(argv[1]), argv[2],
                                              int(argv[3]), int(argv[4]))
  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, signal.SIG_IGN)
  try:
    ended, traceback = _watch(pid, read_fd)
  except ProcessLookupError:
    return 0  # Gone before its obituary started: it could not have run.
  cause = record_end(ledger_path, process_index, ended, traceback)
  if cause is not None:
    os.write(
        2, (f'podrun: process {process_index} (pid {pid}) ended without '
            f'writing its end: {cause}; recorded in {ledger_path}\n').encode())
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
