"""A pod of N processes on this machine, started and supervised as a gang.

Each rank is `python -m launcher` with explicit coordinator flags, K emulated
CPU devices and its own process group, so to the workload it is one host of
an N-host job with real cross-process collectives (gloo). The launcher itself
never imports JAX. It files every rank's output under WORKDIR/logs, echoes it
with a `[rank i/N]` prefix, and ends the whole job as soon as one rank fails,
stalls or the launcher is told to stop:

- the first rank to exit non-zero is the cause; every other rank's process
  group gets SIGINT, then SIGKILL after --kill_grace seconds; the launcher
  exits with the cause's own exit code;
- a preemption is not a failure: SIGTERM to the launcher is forwarded to
  every rank as a preemption notice (as is SIGTERM to one rank, through
  JAX), the ranks save a checkpoint and exit with exit_codes.PREEMPTED, and
  the launcher waits up to --preemption_grace seconds for all of them before
  it kills the rest; when all saved, it exits with PREEMPTED too;
- SIGINT to the launcher is forwarded to every rank, then the failure
  teardown follows; the exit code is 128 + the signal;
- when no rank completes a step for --stall_timeout seconds (or its first
  step within --first_step_timeout), every rank dumps its Python stacks into
  its log, the job is torn down and the exit code is `exit_codes.STALLED`;
- ranks die with the launcher even when it is SIGKILLed (PR_SET_PDEATHSIG).
"""

import dataclasses
import os
import shlex
import signal
import socket
import sys
import threading
import time
import uuid
from typing import Callable, Optional

from launcher import attempts
from launcher.common import gpus as gpus_lib
from launcher.local import elastic
from launcher.local import members as members_lib
from launcher.local import monitor as monitor_lib
from launcher.local import output
from launcher.local import report
from launcher import restart
from launcher import signals
from runtime.common import exit_codes
from runtime.common import files
from runtime.common import goodput
from runtime.common import handoff
from runtime.common import layout
from runtime.common import records


@dataclasses.dataclass(frozen=True)
class PodSpec:
  """What every attempt of a local pod's job runs with, read once from the
  flags (as torchelastic's WorkerSpec is); an attempt adds its process
  count, its number and the job's id (`Gang`).

  Attributes:
    local_devices: each process's emulated CPU devices.
    workdir: the job's --workdir (a bucket's: the logs stay in this
      machine's copy).
    process_args: the launcher flags every process gets.
    coordinator_address: 127.0.0.1:PORT, or None for a free port each
      attempt.
    timeouts: when the gang counts as stalled, a preemption's grace, and
      the wait from SIGINT to SIGKILL when it stops.
    log_all_ranks: whether every process's routine lines reach the console.
    elastic_processes: (K, P), the fewest and most processes of an elastic
      job (--min_processes, --local_processes), or None.
    attempts_may_follow: an elastic or restarting job, whose pod's end is
      not the job's.
    restarts: how the job is restarted; a process that ends with an
      exit code it retries, or of SIGKILL, is reported lost with its host.
    gpus: on a GPU host, its GPUs (launcher/common/gpus.py), which each
      attempt splits among its processes, each its own; () for emulated
      CPU devices (local_devices).
  """
  local_devices: int
  workdir: str
  process_args: tuple[str, ...]
  coordinator_address: Optional[str] = None
  timeouts: monitor_lib.Timeouts = monitor_lib.Timeouts()
  log_all_ranks: bool = False
  elastic_processes: Optional[tuple[int, int]] = None
  attempts_may_follow: bool = False
  restarts: restart.RestartPolicy = restart.RestartPolicy()
  gpus: tuple[gpus_lib.Gpu, ...] = ()


def free_loopback_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on right now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _loopback_address(address: Optional[str]) -> str:
  """The coordinator's HOST:PORT, checked to be on loopback, or a free one.

  Raises:
    ValueError: for an address that is not on loopback.
  """
  if not address:
    return f'127.0.0.1:{free_loopback_port()}'
  host, _, port = address.rpartition(':')
  host = host.strip('[]')
  if not (host in members_lib.LOOPBACK_HOSTS or
          host.startswith('127.')) or (not port.isdigit()):
    raise ValueError(
        f'--coordinator_address={address}: a local pod binds its coordinator '
        'to loopback only; use 127.0.0.1:PORT')
  return address


class Gang:
  """N local processes, each one host of the job; an attempts.Attempt.

  Raises ValueError for a process count below 1 or a coordinator address
  that is not on loopback.

  Example:
    >>> spec = PodSpec(local_devices=4, workdir='/tmp/w',
    ...     process_args=('--config=configs/linear_regression.py',))
    >>> Gang(spec, num_processes=2).run().code
    0

  Args:
    spec: what every attempt of the job runs with.
    num_processes: this attempt's processes (an elastic pod's change).
    job_id: the job's id, the same on every attempt (None: a new one).
    attempt: this attempt's number, from 1.
    should_grow: given time.monotonic(), whether lost processes are back,
      so that the attempt stops at a step boundary to grow.
  """

  def __init__(self,
               spec: PodSpec,
               num_processes: int,
               job_id: Optional[str] = None,
               attempt: int = 1,
               should_grow: Callable[[float], bool] = lambda now: False):
    if num_processes < 1:
      raise ValueError(f'--local_processes={num_processes}; it must be at '
                       'least 1')
    self.spec = spec
    self.num_processes = num_processes
    self.local_devices = spec.local_devices
    self.workdir = spec.workdir
    # A bucket's workdir: the logs stay on this machine, in its copy.
    self.record = layout.Record.of(spec.workdir)
    self.logs_dir = self.record.logs()
    self.coordinator_address = _loopback_address(spec.coordinator_address)
    # Restarts of a job share its id, so that its processes are found by it.
    self.job_id = job_id or uuid.uuid4().hex
    self.attempt = attempt
    # The goodput ledgers of this attempt (runtime/common/goodput.py).
    # A uuid's first 12 hex digits keep the ledgers' folders short.
    self.attempt_name = records.attempt_name(self.job_id[:12], attempt)
    # Whether to stop at a step boundary to grow (elastic.py), given now.
    self._should_grow = should_grow
    elastic_processes = spec.elastic_processes
    # Raises GpuLayoutError for processes that do not divide the GPUs.
    self.gpu_shares = (gpus_lib.split(spec.gpus, num_processes)
                       if spec.gpus else None)
    self._members = members_lib.plan(
        num_processes, spec.local_devices, spec.workdir, self.logs_dir,
        list(spec.process_args), self.coordinator_address,
        handoff.Handoff(job_id=self.job_id,
                        attempt=self.attempt_name,
                        elastic=elastic_processes or None,
                        supervised=True,
                        launcher_record=True), self.gpu_shares)
    self._console = output.Console(num_processes, spec.log_all_ranks)
    self._changed = threading.Event()
    self._signals: list[int] = []

  def print_plan(self) -> int:
    """--dry_run: every rank's exact command line and environment."""
    print(f'local pod: {self.num_processes} processes x {self._devices()}, '
          f'coordinator {self.coordinator_address} (loopback only), '
          'workdir ' + self.workdir)
    for i, share in enumerate(self.gpu_shares or ()):
      print(f'rank {i}: {share.describe()}')
    print('each rank inherits the launcher\'s environment, plus:')
    for member in self._members:
      env = {
          **member.env,
          **member.told.env(),
          handoff.variable('progress_fd'):
              '<progress pipe fd>'
      }
      print(f'rank {member.index}/{self.num_processes}: cd '
            f'{shlex.quote(os.getcwd())} && env ' +
            shlex.join([f'{k}={v}' for k, v in sorted(env.items())] +
                       member.command))
    return exit_codes.OK

  def run(self) -> attempts.AttemptEnd:
    """Starts the ranks, supervises them and returns how the job ended."""
    os.makedirs(self.logs_dir, exist_ok=True)
    started, started_wall = time.monotonic(), time.time()
    threads = []
    with signals.handled((signal.SIGINT, signal.SIGTERM), self._on_signal):
      try:
        progress_reader = output.Progress(self._members)
        threads = self._start(progress_reader)
        monitor = monitor_lib.Monitor(
            self._members, progress_reader, self._signals, self._changed,
            self.spec.timeouts, lambda s: members_lib.forward(self._members, s),
            self._should_grow)
        end = monitor.watch(started)
        progressed = progress_reader.last_advance is not None
        furthest = self._furthest_step() if progressed else None
        fault = self._fault(end)
        if end.state is monitor_lib.GangState.STALLED:
          members_lib.dump_stacks(self._members)
        self._stop(end)
      finally:
        members_lib.kill_survivors(self._members)
        for t in threads:
          t.join(timeout=5)
        for r in self._members:
          if r.log_file is not None:
            r.log_file.close()
        self._write_ledgers_cut_short(started_wall)
    code = report.report(
        end,
        self._members,
        self._console,
        started,
        self.logs_dir,
        self._signals,
        monitor.regrowing,
        attempt=(self.attempt if self.spec.attempts_may_follow else None))
    return attempts.AttemptEnd(code=code,
                               name=self.attempt_name,
                               processes=self.num_processes,
                               launcher_signalled=bool(self._signals),
                               progressed=progressed,
                               counts_steps=True,
                               furthest_step=furthest,
                               fault=fault,
                               regrew=monitor.regrowing,
                               lost=self._lost(fault))

  def _write_ledgers_cut_short(self, started_wall: float) -> None:
    """A rank that ended before it opened its ledger (killed during its
    start-up) gets one from here, so that the attempt is in the record
    (goodput's roll-up counts attempts by their ledgers)."""
    for member in self._members:
      path = self.record.ledger(self.attempt_name, member.index)
      if member.exit_code is None or os.path.exists(path):
        continue
      os.makedirs(os.path.dirname(path), exist_ok=True)
      files.write_json(
          path,
          goodput.ledger_of_a_start_cut_short(self.attempt_name, member.index,
                                              started_wall,
                                              member.exited_wall or time.time(),
                                              member.exit_code))

  @staticmethod
  def _fault(end: monitor_lib.End) -> Optional[records.Fault]:
    """When the failed rank exited and when the pod was declared failed
    (wall times), after a failure; else None."""
    member = end.member
    if end.state is not monitor_lib.GangState.FAILED:
      return None
    assert member is not None and member.exited_wall is not None, end
    return records.Fault(at=member.exited_wall,
                         detected=time.time(),
                         process_index=member.index,
                         exit_code=member.exit_code)

  def _lost(self, fault: Optional[records.Fault]) -> tuple[int, ...]:
    """(the failed process's index,) when it is taken for a lost host
    (elastic.is_lost_process), else ()."""
    if (fault is None or
        fault.process_index is None or not elastic.is_lost_process(
            fault.exit_code, self.spec.restarts.retryable)):
      return ()
    return (fault.process_index,)

  def _furthest_step(self) -> int:
    """The furthest step any rank completed: the ranks' high-water marks,
    written every step (the progress pipe is written at most once a
    second)."""
    marks = layout.ranks(os.path.join(self.record.ledgers(), self.attempt_name),
                         '.step')
    return max([goodput.HighWater.read(m) for m in marks.values()] +
               [m.step for m in self._members])

  def _start(self, progress_reader: output.Progress) -> list[threading.Thread]:
    try:
      members_lib.start(self._members, self.attempt, progress_reader.write_fd)
    finally:
      # EOF on the pipe once every rank has exited.
      os.close(progress_reader.write_fd)
    self._write_job_file()
    threads = [_thread(progress_reader.read)]
    for member in self._members:
      threads += [
          _thread(self._console.pump, member, member.process.stdout, 'stdout',
                  sys.stdout),
          _thread(self._console.pump, member, member.process.stderr, 'stderr',
                  sys.stderr),
          _thread(members_lib.await_exit, member, self._changed)
      ]
    self._console.say(
        f'started {self.num_processes} ranks x {self._devices()}, '
        f'coordinator {self.coordinator_address}, logs in {self.logs_dir}')
    for i, share in enumerate(self.gpu_shares or ()):
      self._console.say(f'rank {i} drives {share.describe()}')
    return threads

  def _devices(self) -> str:
    """Each process's devices, in words."""
    if self.gpu_shares:
      return f'{len(self.gpu_shares[0].gpus)} GPU(s) each'
    return f'{self.local_devices} emulated CPU devices'

  def _write_job_file(self) -> None:
    records.Job(job_id=self.job_id,
                launched_by='podrun',
                attempt=self.attempt,
                attempt_name=self.attempt_name,
                coordinator_address=self.coordinator_address,
                ranks=tuple({
                    'rank': r.index,
                    'pid': r.process.pid,
                    'command': r.command
                } for r in self._members),
                launcher={
                    'launcher_pid': os.getpid()
                }).write(self.record.job())

  def _on_signal(self, signum, frame) -> None:
    del frame
    self._signals.append(signum)
    self._changed.set()

  def _wait_for_change(self) -> None:
    self._changed.wait(0.1)
    self._changed.clear()

  def _stop(self, end: monitor_lib.End) -> None:
    """Stops every rank still running: a signal, a grace period, SIGKILL.

    The signal is SIGINT, not SIGTERM: SIGTERM asks a rank to save a
    checkpoint, which cannot succeed once one of its peers is gone.
    """
    first: int = signal.SIGINT
    if end.state is monitor_lib.GangState.INTERRUPTED and end.signum:
      first = end.signum
    elif end.state is monitor_lib.GangState.PREEMPTION_LATE:
      first = signal.SIGKILL
    members_lib.stop(self._members, first, self.spec.timeouts.kill_grace,
                     self._wait_for_change, lambda: len(self._signals) >= 2)


def _thread(target, *args) -> threading.Thread:
  thread = threading.Thread(target=target, args=args, daemon=True)
  thread.start()
  return thread
