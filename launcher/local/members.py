"""Starting, signalling and stopping the processes of a local pod.

Each rank is `python -m launcher` with explicit coordinator flags and K
emulated CPU devices, in a process group of its own, so that a signal reaches
everything it started; it dies with the launcher even when the launcher is
SIGKILLed (PR_SET_PDEATHSIG).

Each is a `Member` of the pod's gang; "rank" is what the user reads (the
`[rank i/N]` prefix, `logs/rank_<i>.log`).

Example:
  >>> members = plan(2, 4, '/runs/a', ['--config=configs/mlp.py'],
  ...                '127.0.0.1:8476', handoff.Handoff(job_id='j'))
  >>> start(members, attempt=1, progress_fd=w)
  >>> stop(members, signal.SIGINT, grace_s=5, changed=event)
"""

import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Callable, Optional

from launcher.common import cluster
from launcher.common import gpus
from runtime.common import exit_codes
from runtime.common import handoff
from runtime.common import layout

LOOPBACK_HOSTS = ('127.0.0.1', 'localhost', '::1')
_STACK_DUMP_WAIT_S = 2.0


@dataclasses.dataclass
class Member:
  """One process of the pod and what the launcher knows of it."""
  index: int
  command: list[str]
  env: dict[str, str]  # Beside ours and the hand-off's.
  log_path: str
  told: handoff.Handoff = handoff.Handoff()
  popen: Optional[subprocess.Popen] = None
  exit_code: Optional[int] = None
  exited_at: Optional[float] = None
  exited_wall: Optional[float] = None  # time.time() of exited_at.
  signalled_at: Optional[float] = None
  step: int = 0
  log_file: Optional[IO[bytes]] = None
  log_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

  @property
  def process(self) -> subprocess.Popen:
    """The rank's process, once started (the pod starts every rank before
    it waits on, signals or reads any)."""
    if self.popen is None:
      raise AssertionError(f'rank {self.index} was asked for before its start')
    return self.popen


def plan(num_processes: int,
         local_devices: int,
         workdir: str,
         logs_dir: str,
         process_args: list[str],
         coordinator_address: str,
         told: handoff.Handoff,
         gpu_shares: Optional[list[gpus.Share]] = None) -> list[Member]:
  """Every rank's command line, what the launcher tells it (`told`, the
  progress pipe added at its start) and the variables it gets beyond ours.
  With `gpu_shares` (one per rank), each rank drives its own GPUs
  (CUDA_VISIBLE_DEVICES) instead of `local_devices` emulated CPU ones."""
  extra = {'PYTHONUNBUFFERED': '1'}
  if cluster.proxy_warnings('127.0.0.1', os.environ):
    exempt = {
        k: os.environ[k] for k in ('no_proxy', 'NO_PROXY') if k in os.environ
    }
    cluster.exempt_from_proxy(list(LOOPBACK_HOSTS), exempt)
    extra.update(exempt)
  members = []
  for index in range(num_processes):
    env = dict(extra)
    devices = [f'--local_devices={local_devices}']
    if gpu_shares:
      env['CUDA_VISIBLE_DEVICES'] = gpu_shares[index].visible
      devices = []
    members.append(
        Member(index, [
            sys.executable, '-u', '-m', 'launcher', *process_args,
            f'--workdir={workdir}', *devices,
            f'--coordinator_address={coordinator_address}',
            f'--coordinator_bind_address={coordinator_address}',
            f'--num_processes={num_processes}', f'--process_id={index}'
        ],
               env,
               layout.rank_file(logs_dir, index, '.log'),
               told=told))
  return members


def _die_with_parent() -> None:
  """Runs in each rank before exec: a SIGKILLed launcher takes its ranks."""
  if sys.platform.startswith('linux'):
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def start(members: list[Member], attempt: int, progress_fd: int) -> None:
  """Opens each rank's log and starts it, its output on pipes.

  Args:
    ranks: from `plan`.
    attempt: 1 for a new job; a restart appends to the earlier logs.
    progress_fd: the write end of the pipe each rank reports its steps to.
  """
  for member in members:
    member.log_file = open(member.log_path, 'ab' if attempt > 1 else 'wb')
    if attempt > 1:
      member.log_file.write(f'===== attempt {attempt} =====\n'.encode())
    member.popen = subprocess.Popen(
        member.command,
        env={
            **os.environ,
            **member.env,
            **dataclasses.replace(member.told, progress_fd=progress_fd).env()
        },
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=(progress_fd,),
        preexec_fn=_die_with_parent)


def await_exit(member: Member, changed: threading.Event) -> None:
  """Waits for the rank to exit, records its code and time, sets `changed`."""
  returncode = member.process.wait()
  member.exited_at, member.exited_wall = time.monotonic(), time.time()
  member.exit_code = exit_codes.from_returncode(returncode)
  changed.set()


def signal_group(member: Member, signum: int) -> None:
  """Sends `signum` to the rank's whole process group, if it still exists."""
  try:
    os.killpg(member.process.pid, signum)
  except (ProcessLookupError, PermissionError):
    pass


def forward(members: list[Member], signum: int) -> None:
  """Sends `signum` to every rank still running, noting when."""
  now = time.monotonic()
  for member in members:
    if member.exit_code is None:
      member.signalled_at = now
      signal_group(member, signum)


def dump_stacks(members: list[Member]) -> None:
  """Asks every running rank for its Python stacks (faulthandler, SIGUSR1)."""
  for member in members:
    if member.exit_code is None:
      try:
        os.kill(member.process.pid, signal.SIGUSR1)
      except ProcessLookupError:
        pass
  time.sleep(_STACK_DUMP_WAIT_S)


def stop(members: list[Member], first_signal: int, grace_s: float,
         wait: Callable[[], None], interrupted: Callable[[], bool]) -> None:
  """Stops every rank: `first_signal`, up to `grace_s`, then SIGKILL.

  Args:
    ranks: the pod's ranks.
    first_signal: what they get first.
    grace_s: how long they have to exit after it.
    wait: blocks until something changed, or a short while.
    interrupted: true when the user asked again, and the grace is cut short.
  """
  forward(members, first_signal)
  deadline = time.monotonic() + grace_s
  while (any(r.exit_code is None for r in members) and
         time.monotonic() < deadline and not interrupted()):
    wait()
  # Also sweeps what an exited rank may have left in its process group.
  for member in members:
    signal_group(member, signal.SIGKILL)
  for member in members:
    member.process.wait()
  while any(r.exit_code is None for r in members):
    time.sleep(0.01)  # The waiter threads record the codes.


def kill_survivors(members: list[Member]) -> None:
  """SIGKILL to any rank still running: whatever happened, none outlives us."""
  for member in members:
    if member.popen is not None and member.popen.poll() is None:
      signal_group(member, signal.SIGKILL)
