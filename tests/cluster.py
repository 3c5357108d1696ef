"""Processes started by hand, one per "host", as a cluster starts them.

No local pod supervises them: each is `python -m launcher` with explicit
coordinator flags and 1 emulated CPU device, in a session of its own, so
that everything it starts can be stopped by its process group.
"""

import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

from tests import helpers


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


@dataclasses.dataclass
class Exit:
  """How one process ended."""
  code: int
  at: float  # time.time() when the test saw it gone.
  output: str


class Cluster:
  """N launcher processes joined by explicit coordinator flags.

  Example:
    >>> with Cluster(tmp_path, 2, ['--config=...']) as job:
    ...   exits = job.wait(timeout=60)
  """

  def __init__(self,
               workdir: pathlib.Path,
               num_processes: int,
               args: list[str],
               start: Optional[list[int]] = None,
               port: Optional[int] = None,
               rank_args: Optional[dict[int, list[str]]] = None,
               rank_env: Optional[dict[int, dict[str, str]]] = None,
               rank_cwd: Optional[dict[int, pathlib.Path]] = None):
    """Starts the processes.

    Args:
      workdir: the job's workdir (logs go there too).
      num_processes: the job's size.
      args: launcher flags for every process.
      start: the ranks to start; default all.
      port: the coordinator's port; default a free one.
      rank_args, rank_env, rank_cwd: per rank, extra flags, extra
        variables, another directory to run from (a different checkout).
    """
    rank_args, rank_env, rank_cwd = (rank_args or {}), (rank_env or
                                                        {}), (rank_cwd or {})
    self.workdir = workdir
    self.num_processes = num_processes
    address = f'127.0.0.1:{port or free_port()}'
    self.procs: dict[int, subprocess.Popen] = {}
    self.logs = {}
    workdir.mkdir(parents=True, exist_ok=True)
    for rank in (range(num_processes) if start is None else start):
      log = open(workdir / f'cluster_rank_{rank}.log', 'w+')
      self.logs[rank] = log
      self.procs[rank] = subprocess.Popen(
          [
              sys.executable, '-u', '-m', 'launcher', *args,
              *rank_args.get(rank, []), f'--workdir={workdir}',
              '--local_devices=1', f'--coordinator_address={address}',
              f'--coordinator_bind_address={address}',
              f'--num_processes={num_processes}', f'--process_id={rank}'
          ],
          cwd=rank_cwd.get(rank, helpers.REPO),
          env=helpers.launcher_env(**rank_env.get(rank, {})),
          stdin=subprocess.DEVNULL,
          stdout=log,
          stderr=subprocess.STDOUT,
          start_new_session=True)
    self.exits: dict[int, Exit] = {}

  def output(self, rank: int) -> str:
    return (self.workdir / f'cluster_rank_{rank}.log').read_text()

  def poll(self) -> None:
    for rank, proc in self.procs.items():
      if rank not in self.exits and proc.poll() is not None:
        self.exits[rank] = Exit(proc.returncode, time.time(), '')

  def wait(self, timeout: float) -> dict[int, Exit]:
    """Waits for every process; fails, after killing them, past timeout."""
    deadline = time.monotonic() + timeout
    while len(self.exits) < len(self.procs):
      self.poll()
      if time.monotonic() > deadline:
        self.kill()
        raise AssertionError(f'processes still running after {timeout} s: '
                             f'{sorted(set(self.procs) - set(self.exits))}\n' +
                             '\n'.join(
                                 f'--- rank {r}:\n{self.output(r)[-3000:]}'
                                 for r in self.procs))
      time.sleep(0.02)
    for rank, exit_ in self.exits.items():
      exit_.output = self.output(rank)
    return self.exits

  def wait_until_stepping(self,
                          rank: int = 0,
                          step: int = 5,
                          timeout: float = 90) -> None:
    needle = f'step {step}/'
    assert helpers.wait_for(
        lambda: needle in self.output(rank) or any(
            p.poll() is not None for p in self.procs.values()),
        timeout), (self.output(rank))
    assert all(p.poll() is None for p in self.procs.values()), {
        r: self.output(r)[-2000:] for r in self.procs
    }

  def signal(self, rank: int, signum: int) -> float:
    os.kill(self.procs[rank].pid, signum)
    return time.time()

  def kill(self) -> None:
    for proc in self.procs.values():
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    for proc in self.procs.values():
      proc.wait()

  def survivors(self) -> list[int]:
    """Pids of live processes in any of the job's process groups."""
    groups = {p.pid for p in self.procs.values()}
    alive = []
    for pid in os.listdir('/proc'):
      if not pid.isdigit():
        continue
      try:
        if os.getpgid(int(pid)) in groups:
          alive.append(int(pid))
      except ProcessLookupError:
        continue
    return alive

  def __enter__(self) -> 'Cluster':
    return self

  def __exit__(self, *exc_info) -> None:
    leftovers = self.survivors()
    self.kill()
    for log in self.logs.values():
      log.close()
    assert not leftovers or exc_info[0] is not None, (
        f'processes of the job survived: {leftovers}')
