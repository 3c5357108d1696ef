"""The worker half of scripts/launch_tpu_pod.sh, on each TPU VM of a pod.

Standalone on purpose: it imports nothing from this project and runs on the
worker's system Python (3.8 or newer, which every TPU VM image has), since
the job's own interpreter may not exist yet. The driver copies it to
~/podrun/tpu_worker.py and calls it over `gcloud ... ssh --worker=all`:

  python3 ~/podrun/tpu_worker.py run JOB_ID --python=PY [--env=K=V ...]
      [--expected_processes=N] [--replace] [--stop_grace=60]
      [--orphan_timeout=30] [--slice_id=S --num_slices=N]
      [--accelerator_devices=GLOBS] [--kill_accelerator_holders]
      -- <launcher flags>
  python3 ~/podrun/tpu_worker.py stop (JOB_ID | --all) [--grace=60]
  python3 ~/podrun/tpu_worker.py gone JOB_ID --processes=I,J --why=TEXT
  python3 ~/podrun/tpu_worker.py status

Before a job starts, `run` checks that nothing holds the accelerator
(worker_accelerator.py, copied beside this file). In a job of several
slices, a worker's process id runs across them (slice_id x workers per
slice + its index in its slice), and that id labels its lines.

`run` is idempotent: gcloud runs a command again on a worker whose ssh
exited 255 (a dropped connection), so a `run` for a job that already runs
here attaches to it, and one for a job that finished reports its recorded
exit code. The job itself is started by a detached keeper process, in a
process group of its own, with its output in ~/podrun/jobs/JOB_ID/log; the
`run` process only follows that log. Every line goes out as
`[worker W #N] text` (N counts the job's lines from 1, so that the driver
keeps each line once across reconnections), then `[worker W] podrun: exit
CODE`.

No orphans: ssh gives the remote side no signal when the launching machine
goes away, only a broken pipe on its output. The follower prints a
keepalive every few seconds and touches ~/podrun/jobs/JOB_ID/attached while
its output works; the keeper stops the job (SIGTERM, so it saves a
checkpoint, then SIGKILL after --stop_grace) when nobody has been attached
for --orphan_timeout seconds.

`gone` tells the job on this worker that the driver saw the hosts of
processes I, J go (their slice PREEMPTED): it writes ~/podrun/jobs/JOB_ID/
gone, the file the job's processes read (PODRUN_GONE_FILE), so that their
silence ends the job within seconds rather than a heartbeat timeout.

A worker command never exits 255, which gcloud would take for a dropped
connection and run again: a job's exit code 255 leaves `run` as 254 (the
`podrun: exit 255` line still tells the truth).
"""

import argparse
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time

try:  # In the package: the driver's machine, the tests.
  from launcher.tpu import worker_accelerator
except ImportError:  # On a TPU VM: ~/podrun/, this script's own directory.
  import tpu_worker_accelerator as worker_accelerator  # type: ignore[no-redef]

JOBS_DIR = os.path.join(os.path.expanduser('~'), 'podrun', 'jobs')
# Exit codes of `run` itself (the launcher's own are passed through). Copies
# of runtime/common/exit_codes.py's, since this file imports nothing of the
# project; tests/test_exit_codes.py checks that they agree.
BUSY = 11  # ExitCode.WORKDIR_BUSY: another podrun job runs here.
NOT_RUN = 2  # ExitCode.CONFIG_ERROR: a bad command line.
_KEEPALIVE_S = 5.0
# JAX's default coordinator port, on slice 0's worker 0.
_JAX_COORDINATOR_PORT = 8476
_POLL_S = 0.05
# runtime/common/handoff.py's GONE_FILE (tests/test_tpu_worker.py checks).
GONE_FILE_VAR = 'PODRUN_GONE_FILE'


def worker_id() -> str:
  """This worker's index in the pod: emulation and GKE variables, else the
  TPU VM's metadata server, else '?'."""
  for name in ('PODRUN_PROCESS_ID', 'TPU_WORKER_ID'):
    if os.environ.get(name):
      return os.environ[name]
  # Imported here: urllib.request costs about 40 ms a start (http.client,
  # email), paid by every command on every worker, which mostly never ask.
  import urllib.request  # pylint: disable=g-import-not-at-top
  request = urllib.request.Request(
      'http://metadata.google.internal/computeMetadata/v1/instance/'
      'attributes/agent-worker-number',
      headers={'Metadata-Flavor': 'Google'})
  try:
    with urllib.request.urlopen(request, timeout=3) as response:
      return response.read().decode().strip()
  except OSError:
    return '?'


class Job:
  """The files of one job on this worker."""

  def __init__(self, job_id: str):
    self.id = job_id
    self.dir = os.path.join(JOBS_DIR, job_id)

  def path(self, name: str) -> str:
    return os.path.join(self.dir, name)

  def read(self, name: str):
    try:
      with open(self.path(name)) as f:
        return f.read().strip()
    except OSError:
      return None

  def write(self, name: str, text: str) -> None:
    tmp = self.path(name + '.tmp')
    with open(tmp, 'w') as f:
      f.write(text)
    os.replace(tmp, self.path(name))

  def exit_code(self):
    code = self.read('exit')
    return None if code is None else int(code)

  def pgid(self):
    pgid = self.read('pgid')
    return int(pgid) if pgid and pgid.isdigit() else None

  def running(self) -> bool:
    pgid = self.pgid()
    if pgid is None:  # Being started: the keeper writes the group soon.
      started = self.read('starting')
      return (started is not None and self.exit_code() is None and
              time.time() - float(started) < 60)
    try:
      os.killpg(pgid, 0)
    except ProcessLookupError:
      return False
    except PermissionError:
      return True
    return self.exit_code() is None

  def touch_attached(self) -> None:
    with open(self.path('attached'), 'a'):
      os.utime(self.path('attached'))

  def attached_age(self) -> float:
    try:
      return time.time() - os.stat(self.path('attached')).st_mtime
    except OSError:
      return float('inf')


def base_id(job_id: str) -> str:
  """'run7' for 'run7-a2': the driver names each attempt JOB-aN."""
  return re.sub(r'-a\d+$', '', job_id)


def all_jobs():
  try:
    names = sorted(os.listdir(JOBS_DIR))
  except OSError:
    return []
  return [Job(n) for n in names if os.path.isdir(os.path.join(JOBS_DIR, n))]


def stop_group(pgid: int, grace: float) -> bool:
  """SIGTERM to the group (the job saves), SIGKILL after grace; True if it
  had to be killed."""

  def alive() -> bool:
    try:
      os.killpg(pgid, 0)
    except ProcessLookupError:
      return False
    return True

  return worker_accelerator.terminate(lambda s: os.killpg(pgid, s), alive,
                                      grace) == 'killed'


def global_id(args) -> str:
  """This worker's process id in the whole job: slice_id x workers per
  slice + its index in the slice; its index alone for one slice."""
  worker = worker_id()
  if args.num_slices <= 1 or not worker.isdigit():
    return worker
  per_slice = args.expected_processes // args.num_slices
  return str(args.slice_id * per_slice + int(worker))


def multislice_env(args, env) -> dict:
  """The job's place across slices, for the launcher's jax.distributed:
  JAX numbers processes across slices, and the driver's MEGASCALE_*
  variables say where this slice sits. Empty for one slice."""
  if args.num_slices <= 1:
    return {}
  out = {
      'PODRUN_PROCESS_ID': global_id(args),
      'PODRUN_NUM_PROCESSES': str(args.expected_processes)
  }
  if not env.get('PODRUN_COORDINATOR_ADDRESS'):
    out['PODRUN_COORDINATOR_ADDRESS'] = (
        f'{env["MEGASCALE_COORDINATOR_ADDRESS"]}:{_JAX_COORDINATOR_PORT}')
  return out


def keep(args) -> int:
  """The detached keeper: starts the job, records its end, stops orphans."""
  job = Job(args.job_id)
  env = dict(os.environ)
  for pair in args.env:
    key, _, value = pair.partition('=')
    env[key] = value
  env.setdefault('PODRUN_JOB_ID', base_id(job.id))
  env[GONE_FILE_VAR] = job.path('gone')
  if args.expected_processes:
    env['PODRUN_EXPECTED_PROCESSES'] = str(args.expected_processes)
  env.update(multislice_env(args, env))
  # Where the job sits, for whoever debugs it: ~/podrun/jobs/JOB_ID/env.
  job.write(
      'env',
      json.dumps(
          {
              k: v
              for k, v in sorted(env.items())
              if k.startswith(('PODRUN_', 'MEGASCALE_'))
          },
          indent=1))
  with open(job.path('log'), 'ab') as log:
    log.write(f'podrun: starting job {job.id}: {args.python} -m launcher '
              f'{" ".join(args.launcher_args)}\n'.encode())
    log.flush()
    proc = subprocess.Popen(
        [args.python, '-u', '-m', 'launcher', *args.launcher_args],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True)
  job.write('pgid', str(proc.pid))
  stopped_for = ''
  while proc.poll() is None:
    if not stopped_for and job.attached_age() > args.orphan_timeout:
      stopped_for = (f'podrun: nobody has followed job {job.id} for '
                     f'{args.orphan_timeout:g} s (the launching side is '
                     'gone): stopping it (SIGTERM, then SIGKILL after '
                     f'{args.stop_grace:g} s)')
      with open(job.path('log'), 'a') as log:
        log.write(stopped_for + '\n')
      stop_group(proc.pid, args.stop_grace)
    time.sleep(0.2)
  code = proc.returncode
  job.write('exit', str(128 - code if code < 0 else code))
  return 0


def _start(job: Job, args) -> None:
  os.makedirs(job.dir, exist_ok=True)
  job.write('starting', str(time.time()))
  job.write('command', json.dumps(args.launcher_args))
  job.touch_attached()
  keeper = [
      sys.executable,
      os.path.abspath(__file__), 'keep', job.id, f'--python={args.python}',
      f'--stop_grace={args.stop_grace}',
      f'--orphan_timeout={args.orphan_timeout}',
      f'--expected_processes={args.expected_processes}',
      f'--slice_id={args.slice_id}', f'--num_slices={args.num_slices}',
      *[f'--env={e}' for e in args.env], '--', *args.launcher_args
  ]
  subprocess.Popen(keeper,
                   stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL,
                   start_new_session=True,
                   cwd=os.getcwd())


def _others_running(job: Job):
  return [j for j in all_jobs() if j.id != job.id and j.running()]


def _earlier_attempts(job: Job, others):
  return [j for j in others if base_id(j.id) == base_id(job.id)]


def run(args) -> int:
  job = Job(args.job_id)
  worker = global_id(args)
  os.makedirs(JOBS_DIR, exist_ok=True)
  with open(os.path.join(JOBS_DIR, '.lock'), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # Two runs of one job start it once.
    if job.exit_code() is None and not job.running():
      others = _others_running(job)
      earlier = _earlier_attempts(job, others)
      others = [j for j in others if j not in earlier]
      for old in earlier:  # A restart supersedes its own earlier attempt.
        if old.pgid() is not None:
          stop_group(old.pgid(), args.stop_grace)
      if others and not args.replace:
        names = ', '.join(f'{j.id} (since {_since(j)})' for j in others)
        print(
            f'[worker {worker}] podrun: job(s) {names} still run(s) on '
            'this worker; stop them with --stop, or launch with '
            '--replace to stop them first',
            flush=True)
        print(f'[worker {worker}] podrun: exit {BUSY}', flush=True)
        return BUSY
      for other in others:
        print(f'[worker {worker}] podrun: --replace: stopping job {other.id}',
              flush=True)
        if other.pgid() is not None:
          stop_group(other.pgid(), args.stop_grace)
      if not worker_accelerator.check(worker, args.accelerator_devices,
                                      args.kill_accelerator_holders,
                                      args.replace, args.stop_grace):
        print(f'[worker {worker}] podrun: exit {BUSY}', flush=True)
        return BUSY
      _start(job, args)
    elif job.running():
      print(
          f'[worker {worker}] podrun: job {job.id} already runs here: '
          'following it',
          flush=True)
  return follow(job, worker)


def _since(job: Job) -> str:
  started = job.read('starting')
  return time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(
      float(started))) if started else '?'


def follow(job: Job, worker: str) -> int:
  """Prints the job's log from its first line, numbered, until it ends."""
  number, last_alive, offset, partial = 0, time.monotonic(), 0, b''
  signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # A gone reader ends us.
  while True:
    code = job.exit_code()
    chunk = b''
    try:
      with open(job.path('log'), 'rb') as f:
        f.seek(offset)
        chunk = f.read()
    except OSError:
      pass
    offset += len(chunk)
    lines = (partial + chunk).split(b'\n')
    partial = lines.pop()
    out = sys.stdout.buffer
    for line in lines:
      number += 1
      out.write(f'[worker {worker} #{number}] '.encode() + line + b'\n')
    now = time.monotonic()
    if now - last_alive > _KEEPALIVE_S:
      out.write(f'[worker {worker}] podrun: alive\n'.encode())
      last_alive = now
    out.flush()  # Raises, or SIGPIPE kills us, once ssh is gone.
    job.touch_attached()
    if code is not None and not chunk:
      if partial:
        number += 1
        out.write(f'[worker {worker} #{number}] '.encode() + partial + b'\n')
      out.write(f'[worker {worker}] podrun: exit {code}\n'.encode())
      out.flush()
      return 254 if code == 255 else code
    time.sleep(_POLL_S if chunk else 0.2)


def stop(args) -> int:
  jobs = [
      j for j in all_jobs() if args.all or args.job_id in (j.id, base_id(j.id))
  ]
  if not jobs and not args.all:
    jobs = [Job(args.job_id)]
  worker = worker_id()
  for job in jobs:
    if not job.running():
      if not args.all:
        print(f'[worker {worker}] podrun: job {job.id} is not running here')
      continue
    if job.pgid() is None:
      continue
    killed = stop_group(job.pgid(), args.grace)
    how = f'killed after {args.grace:g} s' if killed else 'stopped'
    print(f'[worker {worker}] podrun: job {job.id} {how}', flush=True)
  return 0


def gone(args) -> int:
  """Writes which processes' hosts are gone, for the job's processes."""
  job = Job(args.job_id)
  worker = worker_id()
  if not os.path.isdir(job.dir):
    print(f'[worker {worker}] podrun: job {job.id} never ran here')
    return 0
  processes = sorted({int(p) for p in args.processes.split(',') if p})
  job.write('gone', json.dumps({'processes': processes, 'why': args.why}))
  print(
      f'[worker {worker}] podrun: told job {job.id} that processes '
      f'{", ".join(map(str, processes))} are gone',
      flush=True)
  return 0


def status(args) -> int:
  del args
  worker = worker_id()
  jobs = all_jobs()
  if not jobs:
    print(f'[worker {worker}] podrun: no jobs')
  for job in jobs:
    if job.running():
      state = f'running since {_since(job)} (process group {job.pgid()})'
    elif job.exit_code() is not None:
      state = f'finished with exit code {job.exit_code()}'
    else:
      state = 'never started'
    print(f'[worker {worker}] podrun: job {job.id}: {state}')
  return 0


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog='tpu_worker.py')
  sub = parser.add_subparsers(dest='command', required=True)
  for name in ('run', 'keep'):
    p = sub.add_parser(name)
    p.add_argument('job_id')
    p.add_argument('--python', required=True)
    p.add_argument('--env', action='append', default=[])
    p.add_argument('--expected_processes', type=int, default=0)
    p.add_argument('--replace', action='store_true')
    p.add_argument('--stop_grace', type=float, default=60)
    p.add_argument('--orphan_timeout', type=float, default=30)
    p.add_argument('--slice_id', type=int, default=0)
    p.add_argument('--num_slices', type=int, default=1)
    p.add_argument('--accelerator_devices',
                   default=worker_accelerator.DEFAULT_DEVICES)
    p.add_argument('--kill_accelerator_holders', action='store_true')
  p = sub.add_parser('stop')
  p.add_argument('job_id', nargs='?')
  p.add_argument('--all', action='store_true')
  p.add_argument('--grace', type=float, default=60)
  p = sub.add_parser('gone')
  p.add_argument('job_id')
  p.add_argument('--processes', required=True)
  p.add_argument('--why', default='')
  sub.add_parser('status')
  return parser


def main(argv) -> int:
  launcher_args = []
  if '--' in argv:
    argv, launcher_args = argv[:argv.index('--')], argv[argv.index('--') + 1:]
  args = _parser().parse_args(argv)
  args.launcher_args = launcher_args
  for pair in getattr(args, 'env', []):
    key = pair.partition('=')[0]
    if not key.isidentifier() or '=' not in pair:
      print(
          f'tpu_worker.py: --env {pair}: expected KEY=VALUE with KEY a '
          'variable name',
          file=sys.stderr)
      return NOT_RUN
  if args.command == 'stop' and not (args.all or args.job_id):
    print('tpu_worker.py: stop needs a JOB_ID or --all', file=sys.stderr)
    return NOT_RUN
  return {
      'run': run,
      'keep': keep,
      'stop': stop,
      'status': status,
      'gone': gone
  }[args.command](args)


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
