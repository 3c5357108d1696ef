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

import collections
import ctypes
import dataclasses
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Optional

from launcher.rank import distributed
from launcher import exit_codes
from launcher import rank_output
from runtime import goodput
from runtime import progress

JOB_ID_ENV = 'PODRUN_JOB_ID'
_LOOPBACK_HOSTS = ('127.0.0.1', 'localhost', '::1')
_TAIL_LINES = 20
_STACK_DUMP_WAIT_S = 2.0
_CAUSE_GRACE_S = 5.0
# The ranks' own watchdog (launcher/rank/supervisor.py) fires at the
# timeouts; the pod's fires this much later, for a rank too stuck for that.
_WATCHDOG_BACKSTOP_S = 15.0


def _is_loopback(host: str) -> bool:
  return host in _LOOPBACK_HOSTS or host.startswith('127.')


def free_loopback_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on right now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _die_with_parent() -> None:
  """Runs in each rank before exec: a SIGKILLed launcher takes its ranks."""
  if sys.platform.startswith('linux'):
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _signal_name(code: int) -> str:
  if code > exit_codes.SIGNAL_BASE:
    try:
      return f' ({signal.Signals(code - exit_codes.SIGNAL_BASE).name})'
    except ValueError:
      pass
  return ''


@dataclasses.dataclass
class _Rank:
  """One process of the pod and what the launcher knows of it."""
  index: int
  command: list[str]
  env: dict[str, str]
  log_path: str
  popen: Optional[subprocess.Popen] = None
  exit_code: Optional[int] = None
  exited_at: Optional[float] = None
  signalled_at: Optional[float] = None
  step: int = 0
  log_file: Optional[object] = None
  log_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


@dataclasses.dataclass(frozen=True)
class _Cause:
  """Why the job ended early: a failed rank, a stall or a signal."""
  kind: str  # 'rank', 'stall', 'signal', 'preempted' or 'grace'
  rank: Optional[_Rank] = None
  signum: Optional[int] = None
  message: str = ''


class Pod:
  """N local processes, each one host of the job.

  Raises ValueError for a process count below 1 or a coordinator address
  that is not on loopback.

  Example:
    >>> Pod(num_processes=2, local_devices=4, workdir='/tmp/w',
    ...     rank_args=['--config=configs/linear_regression.py']).run()
    0
  """

  def __init__(self, num_processes: int, local_devices: int, workdir: str,
               rank_args: list[str], coordinator_address: Optional[str] = None,
               stall_timeout: float = 600, first_step_timeout: float = 1800,
               kill_grace: float = 5, log_all_ranks: bool = False,
               preemption_grace: float = 120, job_id: Optional[str] = None,
               attempt: int = 1):
    if num_processes < 1:
      raise ValueError(f'--local_processes={num_processes}; it must be at '
                       'least 1')
    if coordinator_address:
      host, _, port = coordinator_address.rpartition(':')
      if not _is_loopback(host.strip('[]')) or not port.isdigit():
        raise ValueError(
            f'--coordinator_address={coordinator_address}: a local pod binds '
            'its coordinator to loopback only; use 127.0.0.1:PORT')
    else:
      coordinator_address = f'127.0.0.1:{free_loopback_port()}'
    self.num_processes = num_processes
    self.local_devices = local_devices
    self.workdir = workdir
    self.logs_dir = os.path.join(workdir, 'logs')
    self.coordinator_address = coordinator_address
    self.stall_timeout = stall_timeout
    self.first_step_timeout = first_step_timeout
    self.kill_grace = kill_grace
    self.log_all_ranks = log_all_ranks
    self.preemption_grace = preemption_grace
    # Restarts of a job share its id, so that its processes are found by it.
    self.job_id = job_id or uuid.uuid4().hex
    self.attempt = attempt
    # The goodput ledgers of this attempt (runtime/goodput.py).
    self.attempt_name = f'{self.job_id[:12]}-a{attempt}'
    self.launcher_signalled = False
    self._ranks = [self._plan_rank(i, rank_args) for i in range(num_processes)]
    self._changed = threading.Event()
    self._signals = []
    self._last_advance = None
    self._console_lock = threading.Lock()

  def _plan_rank(self, index: int, rank_args: list[str]) -> _Rank:
    command = [sys.executable, '-u', '-m', 'launcher', *rank_args,
               f'--workdir={self.workdir}',
               f'--local_devices={self.local_devices}',
               f'--coordinator_address={self.coordinator_address}',
               f'--coordinator_bind_address={self.coordinator_address}',
               f'--num_processes={self.num_processes}',
               f'--process_id={index}']
    env = {'PYTHONUNBUFFERED': '1', rank_output.SUPERVISED_ENV: '1',
           JOB_ID_ENV: self.job_id, goodput.ATTEMPT_ENV: self.attempt_name}
    if distributed.proxy_warnings('127.0.0.1', os.environ):
      exempt = {k: os.environ[k] for k in ('no_proxy', 'NO_PROXY')
                if k in os.environ}
      distributed.exempt_from_proxy(list(_LOOPBACK_HOSTS), exempt)
      env.update(exempt)
    return _Rank(index, command, env,
                 os.path.join(self.logs_dir, f'rank_{index}.log'))

  def _name(self, rank: _Rank) -> str:
    return f'rank {rank.index}/{self.num_processes}'

  def _say(self, message: str) -> None:
    with self._console_lock:
      print(f'[launcher] {message}', file=sys.stderr, flush=True)

  def print_plan(self) -> int:
    """--dry_run: every rank's exact command line and environment."""
    print(f'local pod: {self.num_processes} processes x {self.local_devices} '
          f'emulated CPU devices, coordinator {self.coordinator_address} '
          '(loopback only), workdir ' + self.workdir)
    print('each rank inherits the launcher\'s environment, plus:')
    for rank in self._ranks:
      env = {**rank.env, progress.PROGRESS_FD_ENV: '<progress pipe fd>'}
      print(f'{self._name(rank)}: cd {shlex.quote(os.getcwd())} && env ' +
            shlex.join([f'{k}={v}' for k, v in sorted(env.items())] +
                       rank.command))
    return exit_codes.OK

  def run(self) -> int:
    """Starts the ranks, supervises them and returns the job's exit code."""
    os.makedirs(self.logs_dir, exist_ok=True)
    started = time.monotonic()
    previous_handlers = {
        s: signal.signal(s, self._on_signal)
        for s in (signal.SIGINT, signal.SIGTERM)
    }
    threads, cause = [], None
    try:
      threads = self._start()
      cause = self._watch(started)
      if cause is not None and cause.kind == 'stall':
        self._dump_stacks()
      self._teardown(cause)
    finally:
      for r in self._ranks:  # Whatever happened above, no rank outlives us.
        if r.popen is not None and r.popen.poll() is None:
          self._kill_group(r, signal.SIGKILL)
      for t in threads:
        t.join(timeout=5)
      for r in self._ranks:
        if r.log_file is not None:
          r.log_file.close()
      for s, handler in previous_handlers.items():
        signal.signal(s, handler)
    return self._report(cause, started)

  def _start(self) -> list[threading.Thread]:
    progress_read, progress_write = os.pipe()
    threads = []
    try:
      for rank in self._ranks:
        # A restarted job appends to the logs of the attempts before it.
        rank.log_file = open(rank.log_path, 'ab' if self.attempt > 1 else 'wb')
        if self.attempt > 1:
          rank.log_file.write(f'===== attempt {self.attempt} =====\n'.encode())
        env = {**os.environ, **rank.env,
               progress.PROGRESS_FD_ENV: str(progress_write)}
        rank.popen = subprocess.Popen(
            rank.command, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, pass_fds=(progress_write,),
            preexec_fn=_die_with_parent)
    finally:
      os.close(progress_write)  # EOF on the pipe once every rank has exited.
    self._write_job_file()
    threads.append(self._thread(self._read_progress, progress_read))
    for rank in self._ranks:
      threads.append(self._thread(self._pump, rank, rank.popen.stdout,
                                  'stdout', sys.stdout))
      threads.append(self._thread(self._pump, rank, rank.popen.stderr,
                                  'stderr', sys.stderr))
      threads.append(self._thread(self._wait, rank))
    self._say(f'started {self.num_processes} ranks x {self.local_devices} '
              f'devices, coordinator {self.coordinator_address}, logs in '
              f'{self.logs_dir}')
    return threads

  @staticmethod
  def _thread(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread

  def _write_job_file(self) -> None:
    job = {
        'job_id': self.job_id,
        'attempt': self.attempt,
        'coordinator_address': self.coordinator_address,
        'launcher_pid': os.getpid(),
        'ranks': [{'rank': r.index, 'pid': r.popen.pid,
                   'command': r.command} for r in self._ranks],
    }
    with open(os.path.join(self.logs_dir, 'job.json'), 'w') as f:
      json.dump(job, f, indent=2)

  def _pump(self, rank: _Rank, pipe, stream_name: str, console) -> None:
    line_prefix = rank_output.prefix(rank.index, self.num_processes)
    for raw in iter(pipe.readline, b''):
      with rank.log_lock:
        rank.log_file.write(raw)
        rank.log_file.flush()
      line = raw.decode('utf-8', 'replace')
      if rank_output.shown_on_console(rank.index, stream_name, line,
                                      self.log_all_ranks):
        with self._console_lock:
          console.write(line_prefix + line + ('' if line.endswith('\n')
                                              else '\n'))
          console.flush()
    pipe.close()

  def _wait(self, rank: _Rank) -> None:
    returncode = rank.popen.wait()
    rank.exited_at = time.monotonic()
    rank.exit_code = exit_codes.from_returncode(returncode)
    self._changed.set()

  def _read_progress(self, fd: int) -> None:
    with os.fdopen(fd, 'rb') as pipe:
      for raw in pipe:
        try:
          index, step = (int(x) for x in raw.split())
          rank = self._ranks[index]
        except (ValueError, IndexError):
          continue
        if step > rank.step:
          rank.step = step
          self._last_advance = time.monotonic()

  def _on_signal(self, signum, frame) -> None:
    del frame
    self._signals.append(signum)
    self.launcher_signalled = True
    self._changed.set()

  def _watch(self, started: float) -> Optional[_Cause]:
    """Waits until the job ends or must be ended; returns why, or None."""
    grace_deadline = None  # Set once a preemption has begun.
    while True:
      now = time.monotonic()
      exited = [r for r in self._ranks if r.exit_code is not None]
      failed = [r for r in exited
                if r.exit_code not in (0, exit_codes.PREEMPTED)]
      preempted = [r for r in exited if r.exit_code == exit_codes.PREEMPTED]
      root = self._root_cause(failed, now, all_exited=len(exited) == len(
          self._ranks))
      if root is not None:
        return _Cause('rank', rank=root)
      if len(exited) == len(self._ranks):
        return _Cause('preempted') if preempted else None
      if self._signals:
        if self._signals[0] != signal.SIGTERM or len(self._signals) > 1:
          return _Cause('signal', signum=self._signals[0])
        if grace_deadline is None:
          self._forward(signal.SIGTERM)
      if (self._signals or preempted) and grace_deadline is None:
        grace_deadline = now + self.preemption_grace
      if grace_deadline is not None:
        if now > grace_deadline:
          late = ', '.join(self._name(r) for r in self._ranks
                           if r.exit_code is None)
          return _Cause('grace', message=(
              f'{late} did not save and exit within --preemption_grace='
              f'{self.preemption_grace:g} s of the preemption notice'))
      else:
        stall = self._stall_message(now - started)
        if stall:
          return _Cause('stall', message=stall)
      self._changed.wait(0.1)
      self._changed.clear()

  def _root_cause(self, failed: list[_Rank], now: float,
                  all_exited: bool) -> Optional[_Rank]:
    """The rank whose failure ended the job, once it is known.

    A rank that stopped because another failed (exit_codes.PEER_FAILED) may
    exit before the cause does (process 0 waits until the others have read
    its cause), so such exits alone wait a moment for the cause.
    """
    if not failed:
      return None
    causes = [r for r in failed if r.exit_code != exit_codes.PEER_FAILED]
    if causes:
      return min(causes, key=lambda r: r.exited_at)
    first = min(failed, key=lambda r: r.exited_at)
    if all_exited or now - first.exited_at > _CAUSE_GRACE_S:
      return first
    return None

  def _forward(self, signum: int) -> None:
    now = time.monotonic()
    for rank in self._ranks:
      if rank.exit_code is None:
        rank.signalled_at = now
        self._kill_group(rank, signum)

  def _stall_message(self, elapsed: float) -> str:
    backstop = _WATCHDOG_BACKSTOP_S
    if self._last_advance is None:
      if 0 < self.first_step_timeout < elapsed - backstop:
        return (f'no rank completed its first step within '
                f'{self.first_step_timeout:g} s (--first_step_timeout), and '
                f'the ranks\' own watchdogs did not end them {backstop:g} s '
                'later')
      return ''
    idle = time.monotonic() - self._last_advance
    if 0 < self.stall_timeout < idle - backstop:
      steps = ', '.join(f'rank {r.index}: {r.step}' for r in self._ranks)
      return (f'no rank completed a step for {idle:.0f} s (--stall_timeout='
              f'{self.stall_timeout:g}, and the ranks\' own watchdogs did not '
              f'end them {backstop:g} s later); last completed steps: {steps}')
    return ''

  def _dump_stacks(self) -> None:
    for rank in self._ranks:
      if rank.exit_code is None:
        try:
          os.kill(rank.popen.pid, signal.SIGUSR1)  # faulthandler, per rank.
        except ProcessLookupError:
          pass
    time.sleep(_STACK_DUMP_WAIT_S)

  def _kill_group(self, rank: _Rank, signum: int) -> None:
    try:
      os.killpg(rank.popen.pid, signum)
    except (ProcessLookupError, PermissionError):
      pass

  def _teardown(self, cause: Optional[_Cause]) -> None:
    """Stops every rank still running: a signal, a grace period, SIGKILL.

    The signal is SIGINT, not SIGTERM: SIGTERM asks a rank to save a
    checkpoint, which cannot succeed once one of its peers is gone.
    """
    first = cause.signum if cause and cause.kind == 'signal' else signal.SIGINT
    if cause and cause.kind == 'grace':
      first = signal.SIGKILL
    self._forward(first)
    deadline = time.monotonic() + self.kill_grace
    while (any(r.exit_code is None for r in self._ranks) and
           time.monotonic() < deadline and len(self._signals) < 2):
      self._changed.wait(0.1)
      self._changed.clear()
    # Also sweeps what an exited rank may have left in its process group.
    for rank in self._ranks:
      self._kill_group(rank, signal.SIGKILL)
    for rank in self._ranks:
      rank.popen.wait()
    while any(r.exit_code is None for r in self._ranks):
      time.sleep(0.01)  # The waiter threads record the codes.

  def _tail(self, rank: _Rank) -> list[str]:
    with open(rank.log_path, 'rb') as f:
      lines = collections.deque(f, maxlen=_TAIL_LINES)
    return [l.decode('utf-8', 'replace').rstrip('\n') for l in lines]

  def _report(self, cause: Optional[_Cause], started: float) -> int:
    """Says how the job ended and returns the launcher's exit code."""
    elapsed = time.monotonic() - started
    if cause is None:
      self._say(f'all {self.num_processes} ranks finished in {elapsed:.1f} s; '
                f'logs in {self.logs_dir}')
      return exit_codes.OK
    if cause.kind == 'rank':
      root = cause.rank
      code = root.exit_code
      what = ('the job stalled: the hang watchdog of ' if code ==
              exit_codes.STALLED else '')
      self._say(f'{what}{self._name(root)} failed first, with exit code '
                f'{code}{_signal_name(code)}, {root.exited_at - started:.1f} '
                f's after start. Last lines of {root.log_path}:\n' +
                '\n'.join(f'  | {l}' for l in self._tail(root)))
      self._describe_others(root)
    elif cause.kind == 'preempted':
      code = exit_codes.PREEMPTED
      notice = ('SIGTERM to the launcher' if self._signals else
                'a preemption notice to a rank')
      self._say(f'preempted by {notice}: every rank saved a checkpoint and '
                f'exited with code {code}, {elapsed:.1f} s after start. Run '
                'the same command again to resume (or use --max_restarts).')
    elif cause.kind == 'grace':
      code = (exit_codes.SIGNAL_BASE + signal.SIGTERM if self._signals
              else exit_codes.PREEMPTED)
      self._say(f'the preemption did not complete: {cause.message}; killed '
                'them. The next start resumes from the last complete '
                'checkpoint.')
      self._describe_others(None)
    elif cause.kind == 'stall':
      code = exit_codes.STALLED
      self._say(f'the job stalled: {cause.message}. Every rank\'s Python '
                f'stacks are in its log under {self.logs_dir}.')
      self._describe_others(None)
    else:
      code = exit_codes.SIGNAL_BASE + cause.signum
      self._say(f'got {signal.Signals(cause.signum).name}: forwarded it to '
                'every rank and stopped the job.')
      self._describe_others(None)
    self._say(f'exit code {code}{_signal_name(code)}; logs in {self.logs_dir}')
    return code

  def _describe_others(self, root: Optional[_Rank]) -> None:
    for rank in self._ranks:
      if rank is root:
        continue
      code = rank.exit_code
      if rank.signalled_at is not None and rank.exited_at >= rank.signalled_at:
        how = (f'stopped by the launcher, exit code {code}{_signal_name(code)}')
      else:
        how = f'exit code {code}{_signal_name(code)}'
      if root is not None and code != 0:
        how += f', a consequence of {self._name(root)}\'s failure, not a cause'
      self._say(f'{self._name(rank)}: {how}')
