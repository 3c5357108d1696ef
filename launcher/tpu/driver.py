"""Runs a job on every worker of a Cloud TPU pod, from the user's machine.

scripts/launch_tpu_pod.sh is the thin entry users type; this is what it
runs (`python -m launcher.tpu launch ...`). It never imports JAX. In
order:

1. reads the pod with `gcloud ... describe` (its worker endpoints and
   accelerator type: the process count every worker must find) and, unless
   --skip_preflight, checks it through cloud-tpu-client (preflight.py);
2. checks each worker's Python before copying anything, and picks one that
   this environment's JAX runs on (3.11+ for JAX 0.10, 3.12+ from 0.11);
3. copies the project (one tarball named by its SHA-256, bundle.py) to
   every worker, and sets up ~/podrun/venv once per version of
   pyproject.toml;
4. runs the job on all workers at once through worker.py, which makes a
   run idempotent (gcloud reruns a command after ssh exits 255), keeps every
   line numbered so that each reaches WORKER_LOG once, and stops a job whose
   launching side has gone;
5. stops every worker on the first failure, Ctrl-C or SIGTERM (attempt.py),
   and restarts after a preemption with the local pod's restart policy
   (launcher/restart.py).
"""

import argparse
import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time

from launcher import exit_codes
from launcher import restart
from launcher.tpu import accelerators
from launcher.tpu import attempt as attempt_lib
from launcher.tpu import bundle as bundle_lib
from launcher.tpu import commands
from launcher.tpu import preflight as preflight_lib
from launcher.tpu.commands import LaunchError


def pod_workers(gcloud: commands.Gcloud, log_path: str) -> tuple[int, str]:
  """(workers, accelerator type) of the pod, from `describe`.

  Raises:
    LaunchError: when describe fails, or its endpoints and its
      accelerator type disagree on the number of hosts.
  """
  result = subprocess.run(gcloud.describe(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, check=False)
  with open(log_path, 'a') as log:
    log.write(f'$ {shlex.join(gcloud.describe())}\n{result.stdout}'
              f'{result.stderr}')
  if result.returncode:
    raise LaunchError(
        f'gcloud could not describe TPU {gcloud.tpu} in {gcloud.zone}: '
        f'{result.stderr.strip()[-500:]}',
        exit_code=exit_codes.POD_UNAVAILABLE)
  info = json.loads(result.stdout)
  endpoints = len(info.get('networkEndpoints') or [])
  kind = (info.get('acceleratorType') or '').rsplit('/', 1)[-1]
  try:
    hosts = accelerators.slice_topology(kind).hosts
  except accelerators.AcceleratorTypeError:
    hosts = endpoints
  if endpoints and hosts != endpoints:
    raise LaunchError(
        f'TPU {gcloud.tpu} is {kind}, which has {hosts} host(s), but '
        f'describe lists {endpoints} worker endpoint(s); recreate the pod or '
        'check it with `gcloud compute tpus tpu-vm describe`.',
        exit_code=exit_codes.TOPOLOGY_MISMATCH)
  return endpoints or hosts, kind


class Launch:
  """Everything one launch knows: the pod, the job, the commands, the logs."""

  def __init__(self, options, launcher_args: list[str]):
    self.options = options
    self.launcher_args = launcher_args
    self.gcloud = commands.Gcloud(options.tpu, options.zone,
                                      options.project)
    self.job_id = options.job_id or (
        f'podrun-{time.strftime("%Y%m%d-%H%M%S", time.gmtime())}-{os.getpid()}')
    self.log_dir = os.path.abspath(options.log_dir or os.path.join(
        'tpu_logs', self.job_id))
    self.workers = 0
    self._short_hash = ''
    self._log_lock = threading.Lock()

  @functools.cached_property
  def jax_version(self) -> str:
    """The JAX every worker installs: this environment's, on a Python it
    runs on (--provision_python installs one where needed)."""
    return commands.worker_jax_version()

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
    info = preflight_lib.check(
        self.options.tpu, self.options.zone, self.options.project,
        self.launcher_args, self.options.wait_healthy, log=self.say)
    self.say(f'preflight: {json.dumps(info.as_dict())}')

  def recoverable(self) -> bool:
    if self.options.skip_preflight:
      return True
    try:
      ok, why = preflight_lib.recoverable(preflight_lib.make_client(
          self.options.tpu, self.options.zone, self.options.project or None))
    except Exception as e:  # pylint: disable=broad-except
      self.say(preflight_lib.explain_api_error(self.options.tpu, e))
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
    self._check_pythons(gcloud_log)
    with tempfile.TemporaryDirectory() as tmp:  # LOG_DIR holds only logs.
      bundle = os.path.join(tmp, 'code.tar.gz')
      code_hash = bundle_lib.bundle(bundle)
      short = code_hash[:16]
      self.say(f'copying the code (sha256 {code_hash}) to every worker')
      copy = self.gcloud.scp(bundle, f'podrun-{short}.tar.gz')
      if commands.run_logged(copy, gcloud_log).returncode:
        raise LaunchError(f'gcloud scp failed; see {gcloud_log}. With an '
                          'ssh-agent running, add the key gcloud uses: '
                          '`ssh-add ~/.ssh/google_compute_engine`.')
    self.say('setting up every worker (the first time for this version: '
             'installs the project)')
    setup = commands.setup_command(short, self.options.worker_python,
                                   self.jax_version)
    if commands.run_logged(self.gcloud.ssh(setup), gcloud_log).returncode:
      raise LaunchError(f'worker set-up failed; see {gcloud_log}')
    self._short_hash = short

  def _check_pythons(self, gcloud_log: str) -> None:
    """Every worker has a Python for this JAX, or gets one, or we stop."""
    options = self.options
    try:
      pythons = commands.check_pythons(self.gcloud, options.worker_python,
                                       gcloud_log, self.jax_version)
    except LaunchError:
      if not options.provision_python:
        raise
      minimum = '.'.join(map(str, commands.required_python(
          self.jax_version)))
      self.say(f'installing Python {minimum} (for JAX {self.jax_version}) '
               'on the workers that lack it (--provision_python)')
      commands.run_logged(self.gcloud.ssh(commands.provision_command(
          options.worker_python, self.jax_version)), gcloud_log)
      pythons = commands.check_pythons(self.gcloud, options.worker_python,
                                       gcloud_log, self.jax_version)
    self.say('worker Python: ' + ', '.join(
        f'worker {w}: {p}' for w, p in sorted(pythons.items())))

  def run_command(self, attempt: int) -> str:
    return commands.run_command(
        self._short_hash, self.job_id, self.options.worker_python,
        self.options.env, self.launcher_args, self.workers, self.options,
        attempt)


def parse(argv: list[str], launcher_args: list[str]
          ) -> tuple[argparse.Namespace, list[str]]:
  """The script's flags, and the launcher flags (those after `--`)."""
  launcher_args = list(launcher_args)
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
  add('--provision_python', action='store_true')
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
  planned = [
      gcloud.ssh(commands.PYTHON_PROBE.replace(
          'FIND', commands.find_python(options.worker_python,
                                       commands.required_python(
                                           launch.jax_version)))),
      gcloud.scp('<tmp>/code.tar.gz', f'podrun-{short}.tar.gz'),
      gcloud.ssh(commands.setup_command(short, options.worker_python,
                                        launch.jax_version)),
      gcloud.ssh(commands.run_command(
          short, launch.job_id, options.worker_python, options.env,
          launch.launcher_args, '<workers from describe>', options)),
  ]
  print(f'# job {launch.job_id}, logs in {launch.log_dir}')
  print(shlex.join(gcloud.describe()))
  if not options.skip_preflight:
    print('# preflight through cloud-tpu-client: READY, HEALTHY, '
          'config.topology.accelerator_type')
  for command in planned:
    print(shlex.join(command))
  print('# on a failure, Ctrl-C or SIGTERM:')
  print(shlex.join(gcloud.ssh(commands.stop_command(
      commands.attempt_id(launch.job_id, 1), options.stop_grace))))
  return exit_codes.OK


def _control(launch: Launch) -> int:
  """--stop and --status: one command on every worker, output as it comes."""
  options = launch.options
  if options.status:
    command = commands.status_command()
  else:
    command = commands.stop_command(
        None if options.stop == 'all' else options.stop, options.stop_grace)
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
  code = restart.run(lambda number: attempt_lib.Attempt(launch, number),
                     max_restarts=options.max_restarts,
                     first_backoff_s=1.0, retryable=retryable,
                     logs_dir=launch.log_dir, say=launch.say)
  if code == exit_codes.OK:
    launch.say(f'job {launch.job_id} finished on every worker')
  else:
    launch.say(f'job {launch.job_id} ended with exit code {code} (logs: '
               f'{launch.log_dir})')
  return code


def main(argv: list[str], launcher_args: list[str]) -> int:
  """`launch`: the script's flags in argv, the launcher's after `--`."""
  try:
    options, launcher_args = parse(argv, launcher_args)
  except SystemExit as e:
    return exit_codes.CONFIG_ERROR if e.code else exit_codes.OK
  try:
    launch = Launch(options, launcher_args)
    if options.dry_run:
      return print_plan(launch)
    if options.stop is not None or options.status:
      return _control(launch)
    os.makedirs(launch.log_dir, exist_ok=True)
    return launch_job(launch)
  except exit_codes.PodrunError as e:
    print(f'launch_tpu_pod: error: {e}', file=sys.stderr)
    return e.exit_code
