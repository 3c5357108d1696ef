"""One process of the job on one Ray node: the actor that starts it, relays
its output and stops it.

The actor holds its placement group's bundle for as long as the job runs;
the process it starts is the per-process path every deployment runs
(`python -m launcher` with its place in PODRUN_* variables,
launcher/common/cluster.py), in a session of its own, and dies with the actor
(PR_SET_PDEATHSIG), so a node's actor that Ray kills leaves nothing behind.

Nothing here imports Ray: launcher/ray/group.py makes this class an actor.

Example (on the driver, through Ray):
  >>> host = ray.remote(Host).options(...).remote()
  >>> ip, port = ray.get(host.address.remote())
  >>> host.start.remote(argv, handoff.Handoff(job_id='j', process_id=0))
  >>> lines, exit_code = ray.get(host.read.remote())   # None while it runs
"""

import collections
import ctypes
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

from runtime.common import exit_codes
from runtime.common import files
from runtime.common import handoff

# Variables no process may inherit from the node: its place in the job, its
# attempt and the multislice set-up come from this attempt alone (a stale
# MEGASCALE_* on a replacement node hangs jax.distributed.initialize). The
# node's own settings (PODRUN_LOCAL_CHECKPOINT_DIR, PODRUN_RECORD_CACHE,
# PODRUN_TLS_DIR, ...) stay.
NOT_INHERITED = handoff.NAMES
NOT_INHERITED_PREFIXES = ('MEGASCALE_',)
_MAX_LINES_PER_READ = 2000


def fresh_env(base: dict[str, str],
              told: handoff.Handoff,
              user: Optional[dict[str, str]] = None) -> dict[str, str]:
  """`base` without anything of an earlier job, with the user's variables
  and then `told` set."""
  env = {
      k: v
      for k, v in base.items()
      if k not in NOT_INHERITED and not k.startswith(NOT_INHERITED_PREFIXES)
  }
  env.update(user or {})
  env.update(told.env())
  return env


def _die_with_parent() -> None:
  pr_set_pdeathsig = 1
  ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class Host:
  """Starts one process of the job on this node and relays what it says."""

  def __init__(self):
    self._popen: Optional[subprocess.Popen] = None
    self._lines: collections.deque = collections.deque()
    self._lock = threading.Lock()
    self._readers: list[threading.Thread] = []
    # Where the driver's word that other processes' hosts went is written
    # for this node's process (PODRUN_GONE_FILE); removed when it ends.
    self._gone_dir = ''

  def address(self) -> tuple[str, int, str]:
    """(this node's address, a port free on it now, Ray's id of the node):
    the coordinator's address, if this is process 0's node."""
    import ray  # pylint: disable=g-import-not-at-top
    ip = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET6 if ':' in ip else socket.AF_INET) as s:
      s.bind((ip, 0))
      return ip, s.getsockname()[1], ray.get_runtime_context().get_node_id()

  def start(self,
            argv: list[str],
            told: handoff.Handoff,
            user: Optional[dict[str, str]] = None) -> int:
    """Starts `python -m launcher ARGV` with the user's variables, told
    `told` and where the word of other hosts' going is written; returns
    its pid."""
    self._gone_dir = tempfile.mkdtemp(prefix='podrun-gone-')
    told = dataclasses.replace(told,
                               gone_file=os.path.join(self._gone_dir,
                                                      'gone.json'))
    self._popen = subprocess.Popen(
        [sys.executable, '-u', '-m', 'launcher', *argv],
        env=fresh_env(dict(os.environ), told, user),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_die_with_parent)
    for name, stream in (('stdout', self._popen.stdout), ('stderr',
                                                          self._popen.stderr)):
      reader = threading.Thread(target=self._pump,
                                args=(name, stream),
                                daemon=True)
      reader.start()
      self._readers.append(reader)
    return self._popen.pid

  def _pump(self, name: str, stream) -> None:
    for raw in iter(stream.readline, b''):
      with self._lock:
        self._lines.append((name, raw.decode(errors='replace')))

  def read(self) -> tuple[list[tuple[str, str]], Optional[int]]:
    """([(stream, line), ...] since the last read, the exit code once the
    process ended and every line of it was read, else None)."""
    code = None
    if self._popen is not None and self._popen.poll() is not None:
      for reader in self._readers:
        reader.join(timeout=5)
      code = exit_codes.from_returncode(self._popen.returncode)
      self._remove_gone_dir()
    with self._lock:
      count = min(len(self._lines), _MAX_LINES_PER_READ)
      lines = [self._lines.popleft() for _ in range(count)]
      if self._lines:
        code = None  # More to read first.
    return lines, code

  def gone(self, processes: list[int], why: str, dead: tuple[int,
                                                             ...] = ()) -> None:
    """Tells this node's process that `processes`' hosts went, `dead` of
    them for certain (launcher/process/peers.py reads it: Gone)."""
    if self._gone_dir and os.path.isdir(self._gone_dir):
      files.write_json(os.path.join(self._gone_dir, 'gone.json'), {
          'processes': sorted(processes),
          'why': why,
          'dead': sorted(dead)
      })

  def _remove_gone_dir(self) -> None:
    if self._gone_dir:
      shutil.rmtree(self._gone_dir, ignore_errors=True)

  def signal(self, signum: int) -> None:
    """Sends `signum` to the process's group, if it still runs."""
    if self._popen is not None and self._popen.poll() is None:
      _signal_group(self._popen.pid, signum)

  def stop(self, grace_s: float) -> None:
    """SIGTERM to the process's group, SIGKILL after `grace_s`."""
    if self._popen is None or self._popen.poll() is not None:
      return
    _signal_group(self._popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while self._popen.poll() is None and time.monotonic() < deadline:
      time.sleep(0.1)
    _signal_group(self._popen.pid, signal.SIGKILL)
    self._popen.wait()
    self._remove_gone_dir()


def _signal_group(pid: int, signum: int) -> None:
  try:
    os.killpg(pid, signum)
  except (ProcessLookupError, PermissionError):
    pass
