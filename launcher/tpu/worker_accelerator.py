"""The accelerator check of launcher/tpu/worker.py, on each TPU VM.

Standalone, as worker.py is (its system Python, nothing of the project);
the set-up command copies it beside ~/podrun/tpu_worker.py as
~/podrun/tpu_worker_accelerator.py. Before a job
starts, every process that holds the accelerator (device files matching
--accelerator_devices) or libtpu's lockfile is named, with its pid, command
line and start time, and a lockfile nobody holds is named as stale: the TPU
runtime would otherwise fail with an opaque error, as it often does right
after a preemption.

Example:
  >>> holders({'/dev/vfio/0'})
  {4242: ['/dev/vfio/0']}
"""

import glob
import os
import signal
import time

DEFAULT_DEVICES = '/dev/accel*,/dev/vfio/*'
# libtpu's lock; PODRUN_LIBTPU_LOCKFILE moves it (the emulated workers share
# one /tmp).
LOCKFILE_ENV = 'PODRUN_LIBTPU_LOCKFILE'


def _device_paths(patterns: str) -> set:
  paths: set[str] = set()
  for pattern in patterns.split(','):
    if pattern.strip():
      paths.update(os.path.realpath(p) for p in glob.glob(pattern.strip()))
  return paths


def _process_since(pid: int) -> str:
  """When a process started, from /proc (clock ticks since boot)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      ticks = int(f.read().rsplit(')', 1)[1].split()[19])
    with open('/proc/stat') as f:
      boot = next(int(l.split()[1]) for l in f if l.startswith('btime'))
  except (OSError, ValueError, StopIteration, IndexError):
    return '?'
  started = boot + ticks / os.sysconf('SC_CLK_TCK')
  return time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(started))


def _cmdline(pid: int) -> str:
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      return f.read().replace(b'\0', b' ').decode(errors='replace').strip()
  except OSError:
    return '?'


def holders(paths: set) -> dict:
  """{pid: sorted paths it holds open} among `paths`, this process aside."""
  found: dict = {}
  for pid in os.listdir('/proc'):
    if not pid.isdigit() or int(pid) == os.getpid():
      continue
    try:
      fds = os.listdir(f'/proc/{pid}/fd')
    except OSError:
      continue  # Gone, or another user's.
    for fd in fds:
      try:
        target = os.readlink(f'/proc/{pid}/fd/{fd}')
      except OSError:
        continue
      if target in paths:
        found.setdefault(int(pid), set()).add(target)
  return {pid: sorted(held) for pid, held in found.items()}


def check(worker: str,
          devices: str = DEFAULT_DEVICES,
          kill_holders: bool = False,
          remove_stale_lockfile: bool = False,
          grace: float = 60) -> bool:
  """Names every process holding the accelerator, and a stale libtpu
  lockfile; returns whether the accelerator is free now.

  Args:
    worker: this worker, for the lines it prints.
    devices: comma-separated globs of the accelerator's device files
      (--accelerator_devices).
    kill_holders: stop the holders and remove the lockfile
      (--kill_accelerator_holders).
    remove_stale_lockfile: remove a lockfile that nobody holds (--replace).
    grace: seconds between SIGTERM and SIGKILL for a holder.
  """
  lockfile = os.environ.get(LOCKFILE_ENV, '/tmp/libtpu_lockfile')
  say = lambda m: print(f'[worker {worker}] podrun: {m}', flush=True)
  held = holders(_device_paths(devices) | {os.path.realpath(lockfile)})
  busy = False
  for pid, paths in sorted(held.items()):
    say(f'the accelerator is busy: pid {pid} ({_cmdline(pid)}), running '
        f'since {_process_since(pid)}, holds {", ".join(paths)}')
    if kill_holders:
      killed = stop_holder(pid, grace)
      say(f'--kill_accelerator_holders: pid {pid} {killed}')
    else:
      busy = True
  if os.path.exists(lockfile) and not held:
    stamp = time.strftime('%Y-%m-%d %H:%M:%S UTC',
                          time.gmtime(os.stat(lockfile).st_mtime))
    if remove_stale_lockfile or kill_holders:
      os.remove(lockfile)
      say(f'removed the stale libtpu lockfile {lockfile} (from {stamp}, '
          'no process holds it)')
    else:
      say(f'a stale libtpu lockfile {lockfile} (from {stamp}) is left, which '
          'no process holds')
      busy = True
  if busy:
    say('the TPU runtime would fail on this worker; launch with --replace to '
        'remove a stale lockfile, or --kill_accelerator_holders to stop '
        'the processes named above (they are not podrun jobs)')
  return not busy


def _alive(pid: int) -> bool:
  """Running: neither gone nor a zombie that its parent has yet to reap."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except (OSError, IndexError):
    return False


def terminate(send, alive, grace: float) -> str:
  """SIGTERM, then SIGKILL after grace: 'had ended', 'stopped' or 'killed'.

  Args:
    send: send(signal) to the process or group; ProcessLookupError when
      it is gone.
    alive: whether it still runs.
    grace: seconds between the two signals.
  """
  try:
    send(signal.SIGTERM)
  except ProcessLookupError:
    return 'had ended'
  deadline = time.monotonic() + grace
  while time.monotonic() < deadline:
    if not alive():
      return 'stopped'
    time.sleep(0.1)
  try:
    send(signal.SIGKILL)
  except ProcessLookupError:
    return 'stopped'
  return 'killed'


def stop_holder(pid: int, grace: float) -> str:
  """SIGTERM, then SIGKILL after grace, to one process that is not ours."""
  outcome = terminate(lambda s: os.kill(pid, s), lambda: _alive(pid), grace)
  return f'killed after {grace:g} s' if outcome == 'killed' else outcome
