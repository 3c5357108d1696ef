"""Runs a job on every worker of a Cloud TPU pod, from the user's machine.

scripts/launch_tpu_pod.sh is the thin entry users type; this is what it
runs (`python -m launcher.tpu_pod launch ...`). It never imports JAX. In
order:

1. reads the pod with `gcloud ... describe` (its worker endpoints and
   accelerator type: the process count every worker must find) and, unless
   --skip_preflight, checks it through cloud-tpu-client (tpu_pod.py);
2. checks each worker's Python before copying anything, and picks a 3.11+
   interpreter there;
3. copies the project (one tarball named by its SHA-256) and
   launcher/tpu_worker.py to every worker, and sets up ~/podrun/venv once
   per version of pyproject.toml;
4. runs the job on all workers at once through tpu_worker.py, which makes a
   run idempotent (gcloud reruns a command after ssh exits 255), keeps every
   line numbered so that each reaches WORKER_LOG once, and stops a job whose
   launching side has gone;
5. stops every worker on the first failure, Ctrl-C or SIGTERM, and restarts
   after a preemption with the local pod's restart policy (restart.py).
"""

import argparse
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

from launcher import exit_codes
from launcher import restart
from launcher import tpu_accelerators
from launcher import tpu_pod

WORKER_SCRIPT = '$HOME/podrun/tpu_worker.py'
_LINE = re.compile(r'^\[worker (\d+|\?)(?: #(\d+))?\] ?(.*)$')
_EXIT = re.compile(r'^podrun: exit (\d+)$')


class LaunchError(Exception):
  """The launch cannot go on; carries the exit code."""

  def __init__(self, message: str, code: int = exit_codes.CONFIG_ERROR):
    super().__init__(message)
    self.code = code


@dataclasses.dataclass
class Gcloud:
  """The gcloud commands of one pod. Every call gets /dev/null as stdin:
  each ssh client reads its stdin, and would eat whatever it is given."""
  tpu: str
  zone: str
  project: str = ''

  def base(self, verb: str) -> list[str]:
    where = [f'--zone={self.zone}'] + (
        [f'--project={self.project}'] if self.project else [])
    return ['gcloud', 'compute', 'tpus', 'tpu-vm', verb, *where]

  def ssh(self, command: str, worker: str = 'all') -> list[str]:
    return [*self.base('ssh'), self.tpu, f'--worker={worker}',
            f'--command={command}']

  def scp(self, source: str, dest: str) -> list[str]:
    return [*self.base('scp'), source, f'{self.tpu}:{dest}', '--worker=all']

  def describe(self) -> list[str]:
    return [*self.base('describe'), self.tpu, '--format=json']


def _run(command: list[str], log_path: str) -> subprocess.CompletedProcess:
  with open(log_path, 'a') as log:
    log.write(f'$ {shlex.join(command)}\n')
    log.flush()
    return subprocess.run(command, stdin=subprocess.DEVNULL, stdout=log,
                          stderr=subprocess.STDOUT, check=False)


def pod_workers(gcloud: Gcloud, log_path: str) -> tuple[int, str]:
  """(workers, accelerator type) of the pod, from `describe`.

  Raises:
    LaunchError: when describe fails, or its endpoints and its accelerator
      type disagree on the number of hosts.
  """
  result = subprocess.run(gcloud.describe(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, check=False)
  with open(log_path, 'a') as log:
    log.write(f'$ {shlex.join(gcloud.describe())}\n{result.stdout}'
              f'{result.stderr}')
  if result.returncode:
    raise LaunchError(
        f'gcloud could not describe TPU {gcloud.tpu} in {gcloud.zone}: '
        f'{result.stderr.strip()[-500:]}', exit_codes.POD_UNAVAILABLE)
  info = json.loads(result.stdout)
  endpoints = len(info.get('networkEndpoints') or [])
  kind = (info.get('acceleratorType') or '').rsplit('/', 1)[-1]
  try:
    hosts = tpu_accelerators.slice_topology(kind).hosts
  except tpu_accelerators.AcceleratorTypeError:
    hosts = endpoints
  if endpoints and hosts != endpoints:
    raise LaunchError(
        f'TPU {gcloud.tpu} is {kind}, which has {hosts} host(s), but '
        f'describe lists {endpoints} worker endpoint(s); recreate the pod or '
        'check it with `gcloud compute tpus tpu-vm describe`.',
        exit_codes.TOPOLOGY_MISMATCH)
  return endpoints or hosts, kind


# Sets $py, on a worker, to the first candidate that can run the job: 3.11+
# with its venv module. $found lists what was tried.
_FIND_PYTHON = r'''py=''; found=''
for p in CANDIDATES; do
  path="$(command -v "$p" 2>/dev/null)" || continue
  v="$("$path" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" || continue
  ok="$("$path" -c 'import sys, venv, ensurepip; print(int(sys.version_info >= (3, 11)))' 2>/dev/null || echo novenv)"
  found="$found $path=$v"; [ "$ok" = novenv ] && found="$found(no venv module)"
  if [ "$ok" = 1 ]; then py="$path"; break; fi
done'''
# Prints one line per worker: `[worker W] podrun-python: ok|missing ...`.
_PYTHON_PROBE = r'''w="${PODRUN_PROCESS_ID:-${TPU_WORKER_ID:-$(curl -sf -m 3 -H 'Metadata-Flavor: Google' http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number 2>/dev/null || echo '?')}}"
FIND
if [ -n "$py" ]; then echo "[worker $w] podrun-python: ok $py"; else echo "[worker $w] podrun-python: missing${found:- (no python3 at all)}"; fi'''
_DEFAULT_CANDIDATES = ('python3.13', 'python3.12', 'python3.11', 'python3')


def find_python(worker_python: str) -> str:
  """The shell snippet that sets $py on a worker (see _FIND_PYTHON)."""
  candidates = (shlex.quote(worker_python) if worker_python else
                ' '.join(_DEFAULT_CANDIDATES))
  return _FIND_PYTHON.replace('CANDIDATES', candidates)


def check_pythons(gcloud: Gcloud, worker_python: str, log_path: str
                  ) -> dict[str, str]:
  """{worker: interpreter path} that can run the job, on every worker.

  Raises:
    LaunchError: naming each worker without one, what it found and the fix.
  """
  probe = _PYTHON_PROBE.replace('FIND', find_python(worker_python))
  result = subprocess.run(gcloud.ssh(probe), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, check=False)
  with open(log_path, 'a') as log:
    log.write(f'$ (python check)\n{result.stdout}{result.stderr}')
  found, problems = {}, []
  for line in result.stdout.splitlines():
    match = re.match(r'^\[worker (\S+)\] podrun-python: (ok|missing) ?(.*)$',
                     line)
    if not match:
      continue
    worker, status, detail = match.groups()
    if status == 'ok':
      found[worker] = detail.split()[0]
    else:
      problems.append(f'worker {worker}: found {detail.strip() or "nothing"}')
  if problems or not found:
    raise LaunchError(
        'no worker Python can run the job (JAX 0.10 needs Python 3.11 or '
        'newer, with its venv module):\n  ' + '\n  '.join(
            problems or [result.stderr.strip()[-500:]]) +
        '\nFix: install one on every worker (for example `sudo apt-get '
        'install -y python3.11 python3.11-venv`, from the deadsnakes PPA on '
        'Ubuntu 22.04) or name it with --worker_python=PATH. Nothing was '
        'copied or started.', exit_codes.CONFIG_ERROR)
  return found


def setup_command(short_hash: str, worker_python: str) -> str:
  """Unpacks the code and, once per pyproject.toml, installs ~/podrun/venv."""
  code = f'$HOME/podrun/code-{short_hash}'
  steps = [
      'set -e', f'd="{code}"', 'mkdir -p "$HOME/podrun"',
      'if [ ! -f "$d/.podrun-ready" ]; then rm -rf "$d"; mkdir -p "$d"; '
      f'tar -xzf "$HOME/podrun-{short_hash}.tar.gz" -C "$d"; '
      'touch "$d/.podrun-ready"; fi',
      f'cp "$d/launcher/tpu_worker.py" "{WORKER_SCRIPT}"',
  ]
  if not worker_python:
    # One environment for every version of the code, reinstalled only when
    # pyproject.toml changes.
    steps += [
        find_python(''),
        'v="$HOME/podrun/venv"',
        's="$v/.podrun-$(sha256sum "$d/pyproject.toml" | cut -c1-16)"',
        'if [ ! -f "$s" ]; then rm -rf "$v"; "$py" -m venv "$v"; '
        '"$v/bin/pip" install -q --upgrade pip; '
        '"$v/bin/pip" install -q "$d[tpu]"; touch "$s"; fi',
    ]
  return '; '.join(steps)


def attempt_id(job_id: str, attempt) -> str:
  """The name of one attempt of a job on the workers (tpu_worker.base_id)."""
  return f'{job_id}-a{attempt}'


def run_command(short_hash: str, job_id: str, worker_python: str,
                envs: list[str], launcher_args: list[str], workers: int,
                options, attempt=1) -> str:
  """The command every worker runs: tpu_worker.py run, every word quoted.

  Every attempt is a job of its own on the workers, JOB_ID-aN, so that a
  restart starts afresh while a rerun of the same command attaches; they
  share the workdir lease through PODRUN_JOB_ID.
  """
  python = (shlex.quote(worker_python) if worker_python else
            '"$HOME/podrun/venv/bin/python"')
  words = [f'--expected_processes={workers}',
           f'--stop_grace={options.stop_grace:g}',
           f'--orphan_timeout={options.orphan_timeout:g}']
  if options.replace:
    words.append('--replace')
  words += [f'--env={e}' for e in [f'PODRUN_JOB_ID={job_id}', *envs]]
  return (f'cd "$HOME/podrun/code-{short_hash}" && exec python3 '
          f'"{WORKER_SCRIPT}" run '
          f'{shlex.quote(attempt_id(job_id, attempt))} --python={python} ' +
          shlex.join(words + ['--', *launcher_args]))


def stop_command(job_id: Optional[str], grace: float) -> str:
  target = shlex.quote(job_id) if job_id else '--all'
  return f'python3 "{WORKER_SCRIPT}" stop {target} --grace={grace:g}'


def status_command() -> str:
  return f'python3 "{WORKER_SCRIPT}" status'


class Attempt:
  """One run of the job on every worker: its output, its end, its stop.

  `run()` returns the attempt's exit code: the first failing worker's
  (a worker's 10, "another process failed", is never taken for the cause),
  or 128 + N when this driver got signal N.
  """

  def __init__(self, launch: 'Launch', number: int):
    self.launch = launch
    self.number = number
    self.launcher_signalled = False
    self._exits: dict[str, int] = {}
    self._last_line: dict[str, int] = {}
    self._headed: set[str] = set()
    self._cause: Optional[int] = None
    self._stopper: Optional[threading.Thread] = None
    self._lock = threading.Lock()
    self._signals: list[int] = []

  def run(self) -> int:
    launch = self.launch
    if self.number > 1 and not launch.recoverable():
      return exit_codes.POD_UNAVAILABLE
    handlers = {s: signal.signal(s, self._on_signal)
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      gcloud = subprocess.Popen(
          launch.gcloud.ssh(launch.run_command(self.number)),
          stdin=subprocess.DEVNULL,
          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
      pumps = [threading.Thread(target=self._pump, args=(gcloud.stdout, out))
               for out in (sys.stdout,)] + [threading.Thread(
                   target=self._pump_stderr, args=(gcloud.stderr,))]
      for t in pumps:
        t.start()
      while gcloud.poll() is None:
        if self._signals:
          self._stop(f'got {signal.Signals(self._signals[0]).name}')
        time.sleep(0.1)
      for t in pumps:
        t.join()
      if self._stopper is not None:
        self._stopper.join()
      return self._code(gcloud.returncode)
    finally:
      for s, h in handlers.items():
        signal.signal(s, h)

  def _on_signal(self, signum, frame) -> None:
    del frame
    self._signals.append(signum)
    self.launcher_signalled = True

  def _code(self, gcloud_code: int) -> int:
    if self._signals:
      return exit_codes.SIGNAL_BASE + self._signals[0]
    if self._cause is not None:
      return self._cause
    if exit_codes.PEER_FAILED in self._exits.values():
      return exit_codes.PEER_FAILED
    workers = self.launch.workers
    if gcloud_code or len(self._exits) != workers:
      self.launch.say(f'gcloud exited {gcloud_code} with {len(self._exits)} '
                      f'of {workers} worker(s) reporting an exit code')
      self._stop('not every worker reported its end')
      if self._stopper is not None:
        self._stopper.join()
      return gcloud_code or exit_codes.FAILED
    return exit_codes.OK

  def _stop(self, why: str) -> None:
    with self._lock:
      if self._stopper is not None:
        return
      launch = self.launch
      launch.say(f'{why}: stopping job {launch.job_id} on every worker '
                 f'(SIGTERM, then SIGKILL after {launch.options.stop_grace:g}'
                 ' s)')
      command = launch.gcloud.ssh(stop_command(
          attempt_id(launch.job_id, self.number), launch.options.stop_grace))
      self._stopper = threading.Thread(
          target=_run, args=(command, launch.path('stop.log')), daemon=True)
      self._stopper.start()

  def _pump(self, pipe, console) -> None:
    for raw in iter(pipe.readline, b''):
      line = raw.decode('utf-8', 'replace').rstrip('\n')
      match = _LINE.match(line)
      if not match:
        self.launch.write('gcloud.log', line)
        print(line, file=console, flush=True)
        continue
      worker, number, text = match.groups()
      if number is not None:
        if int(number) <= self._last_line.get(worker, 0):
          continue  # Seen before a reconnection.
        self._last_line[worker] = int(number)
      elif text == 'podrun: alive':
        continue
      self._worker_line(worker, text, console)

  def _worker_line(self, worker: str, text: str, console) -> None:
    launch = self.launch
    log = f'worker_{worker}.log'
    if worker not in self._headed:
      self._headed.add(worker)
      launch.write(log, f'===== attempt {self.number} of job '
                   f'{launch.job_id} =====')
    launch.write(log, text)
    print(f'[worker {worker}] {text}', file=console, flush=True)
    exit_match = _EXIT.match(text)
    if exit_match:
      code = int(exit_match.group(1))
      self._exits[worker] = code
      if code not in (exit_codes.OK, exit_codes.PEER_FAILED) and (
          self._cause is None):
        self._cause = code
        launch.say(f'worker {worker} exited {code} first')
        self._stop(f'worker {worker} failed')

  def _pump_stderr(self, pipe) -> None:
    for raw in iter(pipe.readline, b''):
      line = raw.decode('utf-8', 'replace').rstrip('\n')
      match = _LINE.match(line)
      if match:
        self._worker_line(match.group(1), match.group(3), sys.stderr)
        continue
      self.launch.write('gcloud.log', line)
      print(line, file=sys.stderr, flush=True)


class Launch:
  """Everything one launch knows: the pod, the job, the commands, the logs."""

  def __init__(self, options, launcher_args: list[str]):
    self.options = options
    self.launcher_args = launcher_args
    self.gcloud = Gcloud(options.tpu, options.zone, options.project)
    self.job_id = options.job_id or (
        f'podrun-{time.strftime("%Y%m%d-%H%M%S", time.gmtime())}-{os.getpid()}')
    self.log_dir = os.path.abspath(options.log_dir or os.path.join(
        'tpu_logs', self.job_id))
    self.workers = 0
    self._short_hash = ''
    self._log_lock = threading.Lock()

  def path(self, name: str) -> str:
    return os.path.join(self.log_dir, name)

  def write(self, name: str, line: str) -> None:
    with self._log_lock, open(self.path(name), 'a') as f:
      f.write(line + '\n')

  def say(self, message: str) -> None:
    print(f'launch_tpu_pod: {message}', file=sys.stderr, flush=True)

  def preflight(self) -> None:
    if self.options.skip_preflight:
      return
    try:
      info = tpu_pod.preflight(
          tpu_pod.make_client(self.options.tpu, self.options.zone,
                              self.options.project or None),
          tpu_pod.expected_accelerator_type(self.launcher_args),
          self.options.wait_healthy, log=self.say)
    except tpu_pod.PodMismatchError as e:
      raise LaunchError(str(e), exit_codes.TOPOLOGY_MISMATCH) from e
    except Exception as e:  # pylint: disable=broad-except
      raise LaunchError(tpu_pod.explain_api_error(self.options.tpu, e),
                        exit_codes.POD_UNAVAILABLE) from e
    self.say(f'preflight: {json.dumps(info.as_dict())}')

  def recoverable(self) -> bool:
    if self.options.skip_preflight:
      return True
    try:
      ok, why = tpu_pod.recoverable(tpu_pod.make_client(
          self.options.tpu, self.options.zone, self.options.project or None))
    except Exception as e:  # pylint: disable=broad-except
      self.say(tpu_pod.explain_api_error(self.options.tpu, e))
      return False
    if not ok:
      self.say(f'TPU {self.options.tpu} {why}: cannot come back, not '
               'relaunching')
    return ok

  def prepare(self) -> None:
    """Describe, preflight, Python check, copy and set up: nothing runs yet."""
    gcloud_log = self.path('gcloud.log')
    self.workers, kind = pod_workers(self.gcloud, gcloud_log)
    self.say(f'TPU {self.options.tpu}: {kind}, {self.workers} worker(s)')
    self.preflight()
    pythons = check_pythons(self.gcloud, self.options.worker_python,
                            gcloud_log)
    self.say('worker Python: ' + ', '.join(
        f'worker {w}: {p}' for w, p in sorted(pythons.items())))
    with tempfile.TemporaryDirectory() as tmp:  # LOG_DIR holds only logs.
      bundle = os.path.join(tmp, 'code.tar.gz')
      code_hash = tpu_pod.bundle(bundle)
      short = code_hash[:16]
      self.say(f'copying the code (sha256 {code_hash}) to every worker')
      if _run(self.gcloud.scp(bundle, f'podrun-{short}.tar.gz'),
              gcloud_log).returncode:
        raise LaunchError(f'gcloud scp failed; see {gcloud_log}. With an '
                          'ssh-agent running, add the key gcloud uses: '
                          '`ssh-add ~/.ssh/google_compute_engine`.')
    self.say('setting up every worker (the first time for this version: '
             'installs the project)')
    if _run(self.gcloud.ssh(setup_command(short, self.options.worker_python)),
            gcloud_log).returncode:
      raise LaunchError(f'worker set-up failed; see {gcloud_log}')
    self._short_hash = short

  def run_command(self, attempt: int) -> str:
    return run_command(self._short_hash, self.job_id,
                       self.options.worker_python, self.options.env,
                       self.launcher_args, self.workers, self.options, attempt)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  """The script's flags, and the launcher flags after `--`."""
  launcher_args = []
  if '--' in argv:
    argv, launcher_args = argv[:argv.index('--')], argv[argv.index('--') + 1:]
  parser = argparse.ArgumentParser(prog='scripts/launch_tpu_pod.sh')
  add = parser.add_argument
  add('--tpu', required=True)
  add('--zone', required=True)
  add('--project', default='')
  add('--workdir', default='')
  add('--env', action='append', default=[])
  add('--max_restarts', type=int, default=0)
  add('--retry_exit_codes', default='')
  add('--wait_healthy', type=float, default=600)
  add('--stop_grace', type=float, default=60)
  add('--orphan_timeout', type=float, default=30)
  add('--worker_python', default='')
  add('--log_dir', default='')
  add('--job_id', default='')
  add('--skip_preflight', action='store_true')
  add('--replace', action='store_true')
  add('--dry_run', action='store_true')
  add('--stop', nargs='?', const='all', default=None, metavar='JOB_ID')
  add('--status', action='store_true')
  options = parser.parse_args(argv)
  if not re.fullmatch(r'[A-Za-z0-9._-]*', options.job_id):
    parser.error("--job_id may hold letters, digits, '.', '_' and '-' only")
  for pair in options.env:
    if not re.match(r'^[A-Za-z_][A-Za-z0-9_]*=', pair):
      parser.error(f'--env {pair}: expected KEY=VALUE with KEY a variable '
                   'name')
  if not launcher_args and options.stop is None and not options.status:
    parser.error('give the launcher flags after --, e.g. -- '
                 '--config=configs/linear_regression.py')
  if options.workdir:
    launcher_args.append(f'--workdir={options.workdir}')
  return options, launcher_args


def print_plan(launch: Launch) -> int:
  """--dry_run: every command, in order; runs none."""
  options, gcloud = launch.options, launch.gcloud
  short = '<code sha256[:16]>'
  print(f'# job {launch.job_id}, logs in {launch.log_dir}')
  print(shlex.join(gcloud.describe()))
  if not options.skip_preflight:
    print('# preflight through cloud-tpu-client: READY, HEALTHY, '
          'config.topology.accelerator_type')
  print(shlex.join(gcloud.ssh(_PYTHON_PROBE.replace(
      'FIND', find_python(options.worker_python)))))
  print(shlex.join(gcloud.scp('<tmp>/code.tar.gz', f'podrun-{short}.tar.gz')))
  print(shlex.join(gcloud.ssh(setup_command(short, options.worker_python))))
  print(shlex.join(gcloud.ssh(run_command(
      short, launch.job_id, options.worker_python, options.env,
      launch.launcher_args, '<workers from describe>', options))))
  print('# on a failure, Ctrl-C or SIGTERM:')
  print(shlex.join(gcloud.ssh(stop_command(attempt_id(launch.job_id, 1),
                                           options.stop_grace))))
  return exit_codes.OK


def _control(launch: Launch) -> int:
  """--stop and --status: one command on every worker, output as it comes."""
  options = launch.options
  command = (status_command() if options.status else stop_command(
      None if options.stop == 'all' else options.stop, options.stop_grace))
  result = subprocess.run(launch.gcloud.ssh(command),
                          stdin=subprocess.DEVNULL, check=False)
  return result.returncode


def launch_job(launch: Launch) -> int:
  options = launch.options
  try:
    retryable = restart.check_retryable(
        int(c) for c in options.retry_exit_codes.split(',') if c.strip())
  except ValueError as e:
    raise LaunchError(f'--retry_exit_codes: {e}') from e
  launch.say(f'job {launch.job_id}, logs in {launch.log_dir}')
  launch.prepare()
  code = restart.run(lambda number: Attempt(launch, number),
                     max_restarts=options.max_restarts,
                     first_backoff_s=1.0, retryable=retryable,
                     logs_dir=launch.log_dir, say=launch.say)
  if code == exit_codes.OK:
    launch.say(f'job {launch.job_id} finished on every worker')
  else:
    launch.say(f'job {launch.job_id} ended with exit code {code} (logs: '
               f'{launch.log_dir})')
  return code


def main(argv: list[str]) -> int:
  try:
    options, launcher_args = parse(argv)
  except SystemExit as e:
    return exit_codes.CONFIG_ERROR if e.code else exit_codes.OK
  launch = Launch(options, launcher_args)
  if options.dry_run:
    return print_plan(launch)
  if options.stop is not None or options.status:
    return _control(launch)
  os.makedirs(launch.log_dir, exist_ok=True)
  try:
    return launch_job(launch)
  except LaunchError as e:
    print(f'launch_tpu_pod: error: {e}', file=sys.stderr)
    return e.code
