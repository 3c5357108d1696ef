"""A real single-node SLURM and Open MPI's mpirun, for the scheduler tests.

`Slurm` starts munged, slurmctld and slurmd as children of the test process,
each in the foreground and in a process group of its own, with a slurm.conf,
a munge key and every state file in one temporary directory: nothing in /etc
or /run is touched, and every daemon listens on 127.0.0.1 only. `stop()`
ends them by process group. The partition oversubscribes, so that 2 to 4
tasks fit on 2 cores.

Example:
  >>> slurm = Slurm(tmp_dir).start()
  >>> slurm.run(['srun', '-n', '2', 'hostname'])
  >>> slurm.stop()
"""

import os
import shutil
import signal
import socket
import subprocess
import time
from typing import Optional

from tests import helpers

# What the scheduler tests need on PATH, and the Debian packages with them.
SLURM_BINARIES = ('munged', 'slurmctld', 'slurmd', 'srun', 'sbatch', 'scontrol',
                  'scancel', 'squeue', 'sinfo')
MPI_BINARIES = ('mpirun',)
PACKAGES = 'slurm-wlm munge openmpi-bin'

_CONF = '''ClusterName=podrun
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={dir}/munge.sock
CredType=cred/munge
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait={kill_wait}
InactiveLimit=0
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
'''


def missing(binaries) -> list[str]:
  """The binaries of `binaries` that are not on PATH."""
  return [b for b in binaries if shutil.which(b) is None]


def require(binaries) -> None:
  """Fails (never skips) naming what is missing and how to install it."""
  absent = missing(binaries)
  if absent:
    raise AssertionError(
        f'{", ".join(absent)} not found: the scheduler tests need the real '
        f'ones. Install them with `apt-get install -y {PACKAGES}` (.ci/run '
        'does).')


def _free_port_pair() -> int:
  """A port P on 127.0.0.1 such that P and P + 1 are both free now."""
  for _ in range(50):
    with socket.socket() as first:
      first.bind(('127.0.0.1', 0))
      port = first.getsockname()[1]
      with socket.socket() as second:
        try:
          second.bind(('127.0.0.1', port + 1))
        except OSError:
          continue
      return port
  raise RuntimeError('no two adjacent free ports on 127.0.0.1')


class Slurm:
  """A single-node SLURM cluster for the lifetime of a test module."""

  def __init__(self, directory: str, kill_wait_s: int = 30):
    self.dir = directory
    self.host = socket.gethostname()
    self.kill_wait_s = kill_wait_s
    self.conf = os.path.join(directory, 'slurm.conf')
    self.env = {**os.environ, 'SLURM_CONF': self.conf}
    self._daemons: list[subprocess.Popen] = []

  def start(self, timeout_s: float = 60) -> 'Slurm':
    """Writes the config and key, starts the daemons, waits for the node."""
    require(SLURM_BINARIES)
    for sub in ('state', 'spool'):
      os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
    key = os.path.join(self.dir, 'munge.key')
    with open(key, 'wb') as f:
      f.write(os.urandom(1024))
    os.chmod(key, 0o600)
    port = _free_port_pair()
    with open(self.conf, 'w') as f:
      f.write(
          _CONF.format(host=self.host,
                       ctld_port=port,
                       d_port=port + 1,
                       dir=self.dir,
                       cpus=os.cpu_count() or 2,
                       kill_wait=self.kill_wait_s))
    self._spawn('munged', [
        'munged', '-F', '-f', f'--socket={self.dir}/munge.sock',
        f'--key-file={key}', f'--pid-file={self.dir}/munged.pid',
        f'--seed-file={self.dir}/munged.seed', '--origin=127.0.0.1'
    ])
    helpers.wait_for(lambda: os.path.exists(f'{self.dir}/munge.sock'), 10)
    self._spawn('slurmctld', ['slurmctld', '-D', '-c'])
    self._spawn('slurmd', ['slurmd', '-D', '-N', self.host])
    if not helpers.wait_for(self._node_idle, timeout_s):
      logs = self.logs()
      self.stop()
      raise AssertionError(f'the SLURM node did not come up within '
                           f'{timeout_s:g} s:\n{logs}')
    return self

  def _spawn(self, name: str, command: list[str]) -> None:
    log = open(os.path.join(self.dir, f'{name}.out'), 'wb')
    self._daemons.append(
        subprocess.Popen(command,
                         env=self.env,
                         stdin=subprocess.DEVNULL,
                         stdout=log,
                         stderr=subprocess.STDOUT,
                         start_new_session=True))

  def _node_idle(self) -> bool:
    result = self.run(['sinfo', '-h', '-o', '%T'], timeout=10, check=False)
    return result.stdout.strip() == 'idle'

  def run(self,
          command: list[str],
          timeout: float = 60,
          check: bool = True,
          **kwargs) -> subprocess.CompletedProcess:
    """Runs a SLURM client command against this cluster."""
    result = subprocess.run(command,
                            env={
                                **self.env,
                                **kwargs.pop('env', {})
                            },
                            capture_output=True,
                            text=True,
                            timeout=timeout,
                            check=False,
                            stdin=subprocess.DEVNULL,
                            **kwargs)
    if check and result.returncode:
      raise AssertionError(f'{command} exited {result.returncode}:\n'
                           f'{result.stdout}{result.stderr}')
    return result

  def set_kill_wait(self, seconds: int) -> None:
    """Rewrites KillWait in slurm.conf and has slurmctld read it again."""
    with open(self.conf) as f:
      text = f.read()
    with open(self.conf, 'w') as f:
      f.write(
          text.replace(f'KillWait={self.kill_wait_s}\n',
                       f'KillWait={seconds}\n'))
    self.kill_wait_s = seconds
    self.run(['scontrol', 'reconfigure'])
    if not helpers.wait_for(
        lambda: f'= {seconds} sec' in next(
            (l for l in self.run(['scontrol', 'show', 'config']).stdout.
             splitlines() if l.startswith('KillWait')), ''), 30):
      raise AssertionError(f'slurmctld did not take KillWait={seconds}')

  def job_state(self, job_id: str) -> Optional[str]:
    """The job's state (PENDING, RUNNING, ...) or None once it is gone."""
    result = self.run(['squeue', '-h', '-j', job_id, '-o', '%T'], check=False)
    return result.stdout.strip() or None

  def logs(self) -> str:
    out = []
    for name in ('slurmctld.log', 'slurmd.log', 'munged.out', 'slurmctld.out',
                 'slurmd.out'):
      path = os.path.join(self.dir, name)
      if os.path.exists(path):
        with open(path, errors='replace') as f:
          out.append(f'--- {name}\n' + ''.join(f.readlines()[-15:]))
    return '\n'.join(out)

  def stop(self) -> None:
    """Ends every daemon by its process group: SIGTERM, then SIGKILL."""
    for daemon in reversed(self._daemons):
      _stop_group(daemon, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for daemon in reversed(self._daemons):
      try:
        daemon.wait(max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        _stop_group(daemon, signal.SIGKILL)
        daemon.wait()
    self._daemons = []


def _stop_group(process: subprocess.Popen, signum: int) -> None:
  try:
    os.killpg(process.pid, signum)
  except ProcessLookupError:
    pass
