"""Runs a job on every worker of a Cloud TPU pod, from the user's machine.

scripts/launch_tpu_pod.sh is the thin entry users type; this is what it
runs (`python -m launcher.tpu launch ...`). It never imports JAX. In
order:

0. with --create, asks for the slice(s) through a queued resource and waits
   through its phases, each with its own timeout (queued.py);
1. reads each slice with `gcloud ... describe` (its worker endpoints and
   accelerator type: the process count every worker must find) and, unless
   --skip_preflight, checks it through cloud-tpu-client (preflight.py);
2. checks each worker's Python before copying anything, and picks one that
   this environment's JAX runs on (3.11+ for JAX 0.10, 3.12+ from 0.11);
3. copies the project (one tarball named by its SHA-256, bundle.py) to
   every worker, and sets up ~/podrun/venv once per version of
   pyproject.toml;
4. runs the job on all workers of all slices at once through worker.py,
   which checks the accelerator is free, makes a run idempotent (gcloud
   reruns a command after ssh exits 255), keeps every line numbered so that
   each reaches WORKER_LOG once, and stops a job whose launching side has
   gone;
5. stops every worker on the first failure, Ctrl-C or SIGTERM (attempt.py),
   and restarts after a preemption with the local pod's restart policy
   (launcher/restart.py), recreating a slice it created that was lost
   (babysit.py);
6. deletes the queued resource it created on a signal, when it never came
   up, and with --delete_after at the end.

--dry_run, --status and --stop are control.py; the flags are flags.py.
"""

import functools
import os
import signal
import sys
import tempfile
import threading
import time
import weakref
from typing import Optional

from launcher import restart
from launcher import signals
from launcher import tls
from launcher.tpu import attempt as attempt_lib
from launcher.tpu import bundle
from launcher.tpu import commands
from launcher.tpu import control
from launcher.tpu import flags
from launcher.tpu import queued
from launcher.tpu import setup as setup_lib
from launcher.tpu import slices as slices_lib
from runtime.common import env_vars
from runtime.common import exit_codes
from runtime.common import files
from launcher.common import flag_values
from launcher.common import goodput_rollup
from launcher.common import project as project_lib
from runtime.common import layout
from launcher.common import record_mirror


class Launch:
  """Everything one launch knows: the slices, the job, the commands, the
  logs, and the signals it got."""

  def __init__(self, options: flags.Options, launcher_args: list[str],
               project: Optional[project_lib.Project] = None):
    self.options = options
    # What travels besides podrun's code (None: --stop, --status).
    self.project = project
    self.launcher_args = launcher_args
    self.gcloud = commands.Gcloud(options.tpu, options.zone,
                                  options.project)
    self.job_id = options.job_id or (
        f'podrun-{time.strftime("%Y%m%d-%H%M%S", time.gmtime())}-{os.getpid()}')
    self.log_dir = os.path.abspath(options.log_dir or os.path.join(
        'tpu_logs', self.job_id))
    self.all_nodes = queued.node_names(options.tpu, options.num_slices)
    self.coordinator = ''
    self.setup = setup_lib.SliceSetup(
        self.gcloud, options, launcher_args, self.job_id, self.say,
        self.path('gcloud.log'), self.stop_if_interrupted,
        lambda: self.jax_version, lambda: self.authority, project)
    self.signals: list[int] = []
    self.slices: slices_lib.Slices = slices_lib.of(self)
    self._log_lock = threading.Lock()

  @property
  def workers(self) -> int:
    """Workers per slice, once described (0 before)."""
    return self.setup.workers

  @property
  def infos(self) -> dict[str, setup_lib.SliceInfo]:
    return self.setup.infos

  @property
  def nodes(self) -> tuple[str, ...]:
    """The slices the job runs on: every one, or an elastic job's now."""
    return self.slices.nodes()

  @functools.cached_property
  def jax_version(self) -> str:
    """The JAX every worker installs: this environment's, on a Python it
    runs on (--provision_python installs one where needed)."""
    return commands.worker_jax_version()

  def on_signal(self, signum, frame) -> None:
    del frame
    self.signals.append(signum)

  def interrupted(self) -> bool:
    return bool(self.signals)

  def stop_if_interrupted(self) -> None:
    """Between the set-up's steps: a signal ends the launch there."""
    if self.signals:
      raise queued.Interrupted()

  def path(self, name: str) -> str:
    return os.path.join(self.log_dir, name)

  def write(self, name: str, line: str) -> None:
    with self._log_lock, open(self.path(name), 'a') as f:
      f.write(line + '\n')

  def say(self, message: str) -> None:
    print(f'launch_tpu_pod: {message}', file=sys.stderr, flush=True)

  def prepare(self, nodes: Optional[tuple[str, ...]] = None) -> None:
    """Describe, preflight, Python check, copy and set up `nodes` (default
    the job's): nothing runs yet. Again after a slice is recreated: its VMs
    start with empty disks."""
    self.setup.prepare(nodes or self.nodes)

  @functools.cached_property
  def authority(self) -> tls.PodAuthority:
    """The launch's certificate authority for mutual TLS on the job's
    coordinator (launcher/tls.py), where --tls and the workers' JAX allow;
    removed from this machine with the launch."""
    authority = tls.PodAuthority(tls.mode_of(self.launcher_args),
                                 self.job_id, self.say, self.jax_version)
    weakref.finalize(self, authority.close)
    return authority

  def place(self, slice_id: int) -> commands.SlicePlace:
    """Slice `slice_id` of the job's; the first holds the coordinator."""
    first = self.infos.get(self.nodes[0])
    return commands.SlicePlace(
        slice_id, len(self.nodes),
        first.first_address if first else self.coordinator,
        self.options.megascale_port)

  def run_command(self, attempt: int, slice_id: int = 0) -> str:
    envs = list(self.options.env)
    if self.options.min_slices and isinstance(self.workers, int):
      # Every count of slices from --min_slices up: refused before step 1
      # when the config cannot run on one of them.
      envs.append(f'{env_vars.ELASTIC_PROCESSES}='
                  f'{self.options.min_slices * self.workers}-'
                  f'{self.options.num_slices * self.workers}')
    if self.authority.directory:
      envs.append(f'{env_vars.TLS_DIR}={commands.tls_dir(self.job_id)}')
    return commands.run_command(
        self.setup.code_hash, self.job_id, self.options.worker_python,
        envs, self.launcher_args, self.workers, self.options,
        attempt, self.place(slice_id), bundle.run_directory(self.project))

def _run(launch: Launch) -> int:
  """Creates the slice (--create), prepares the workers and runs the job
  with its restarts."""
  launch.slices.create()
  launch.slices.wait_up()
  launch.prepare()
  launch.stop_if_interrupted()
  return restart.run(lambda number: attempt_lib.Attempt(launch, number),
                     launch.options.supervision, logs_dir=launch.log_dir,
                     say=launch.say,
                     on_signal=lambda signum: launch.on_signal(signum, None),
                     pending_signal=lambda: (launch.signals or [None])[0],
                     resize=slices_lib.resize(launch, launch.slices))


def _clean_up(launch: Launch, code: int) -> None:
  """Deletes the queued resource this launch created when nothing should
  keep it: a signal, --delete_after, or a slice that is not up (never came
  up, or was lost and not brought back)."""
  slices = launch.slices
  if not slices.ours:
    return
  if launch.signals:
    slices.delete(f'got {signal.Signals(launch.signals[0]).name}')
  elif not slices.up:  # No job may have run: say what is true.
    slices.delete('the slice is not up')
  elif launch.options.delete_after:
    slices.delete('the job ended (--delete_after)')
  else:
    launch.say(_kept(launch, code))


def _kept(launch: Launch, code: int) -> str:
  """What is left billing, and how to delete it."""
  names = launch.slices.created()
  zone = launch.options.zone
  if len(names) == 1:
    return (f'queued resource {names[0]} is kept (exit code {code}); delete '
            f'it with `gcloud compute tpus queued-resources delete '
            f'{names[0]} --zone={zone} --force`, or launch with '
            '--delete_after')
  return (f'queued resources {", ".join(names)} are kept (exit code {code}); '
          'delete each with `gcloud compute tpus queued-resources delete NAME '
          f'--zone={zone} --force`, or launch with --delete_after')


def _job_record(launch: Launch, code: int) -> dict:
  """WORKDIR/logs/job.json of a TPU launch: where and how the job ran."""
  return {'job_id': launch.job_id, 'launched_by': 'launch_tpu_pod',
          'exit_code': code, 'tpu': launch.options.tpu,
          'zone': launch.options.zone, 'slices': list(launch.all_nodes),
          'workers_per_slice': launch.workers,
          'accelerator_type': launch.options.accelerator_type or None,
          'launcher_args': launch.launcher_args, 'log_dir': launch.log_dir}


def _complete_the_record(launch: Launch, url: str, path: str,
                         code: int) -> None:
  """Adds the attempts to URL/logs/attempts.jsonl, then the roll-up over
  every attempt (URL/goodput.jsonl, the goodput of URL/summary.json) and
  URL/logs/job.json: the launcher's files, which no process on the VMs
  could write (they end before the driver's last attempt is known)."""
  record_mirror.merge_lines(url, f'{layout.LOGS}/{layout.ATTEMPTS}', path)
  with tempfile.TemporaryDirectory(prefix='podrun_record_') as local:
    mirror = record_mirror.Mirror(url, local,
                                  owns=record_mirror.launcher_owns)
    mirror.fetch()
    goodput_rollup.roll_up_into_summary(local)
    files.write_json(layout.Record(local).job(),
                     _job_record(launch, code))
    mirror.push()
    if mirror.unwritten:
      raise RuntimeError(f'{", ".join(sorted(mirror.unwritten))} not written')


def _keep_attempts_with_the_record(launch: Launch, code: int) -> None:
  """When the workdir is a bucket, completes its record with this launch's
  part (`_complete_the_record`), so that scripts/goodput.py gs://... and
  summary.json account for every attempt; bounded, as a process's last
  upload is."""
  url = flag_values.workdir_of(launch.launcher_args) or ''
  path = launch.path(layout.ATTEMPTS)
  if not layout.in_bucket(url) or not os.path.exists(path):
    return
  failed: list[Exception] = []

  def complete():
    try:
      _complete_the_record(launch, url, path, code)
    except Exception as e:  # pylint: disable=broad-except
      failed.append(e)

  worker = threading.Thread(target=complete, name='record', daemon=True)
  worker.start()
  worker.join(record_mirror.FINISH_TIMEOUT_S)
  if worker.is_alive() or failed:
    why = (failed[0] if failed else
           f'no answer in {record_mirror.FINISH_TIMEOUT_S:g} s')
    launch.say(f'warning: cannot add the attempts and the goodput roll-up '
               f'to {url} ({why}); the attempts are in {path}')


def launch_job(launch: Launch) -> int:
  launch.say(f'job {launch.job_id}, logs in {launch.log_dir}')
  code = exit_codes.FAILED
  with signals.handled((signal.SIGINT, signal.SIGTERM), launch.on_signal):
    try:
      code = _run(launch)
    except queued.Interrupted:
      pass
    except exit_codes.PodrunError as e:
      if not launch.signals:  # Else a gcloud the terminal's Ctrl-C cut.
        launch.say(f'error: {e}')
      code = e.exit_code
    finally:  # Even on a bug of ours: nothing left billing.
      if launch.signals:
        code = exit_codes.SIGNAL_BASE + launch.signals[0]
      _clean_up(launch, code)
  _keep_attempts_with_the_record(launch, code)
  if code == exit_codes.OK:
    launch.say(f'job {launch.job_id} finished on every worker')
  else:
    launch.say(f'job {launch.job_id} ended with exit code {code} (logs: '
               f'{launch.log_dir})')
  return code


def main(argv: list[str], launcher_args: list[str]) -> int:
  """`launch`: the script's flags in argv, the launcher's after `--`."""
  try:
    options, launcher_args = flags.parse(argv, launcher_args)
  except SystemExit as e:
    return exit_codes.CONFIG_ERROR if e.code else exit_codes.OK
  try:
    control_only = options.stop is not None or options.status
    project = None if control_only else project_lib.find(
        options.project_dir, options.project_max_mb,
        podrun_root=project_lib.podrun_root())
    launch = Launch(options, launcher_args, project)
    warning = flags.local_workdir_warning(options, launcher_args)
    if warning and not control_only:
      launch.say(warning)
    if options.dry_run:
      return control.print_plan(launch)
    if control_only:
      return control.control(launch)
    os.makedirs(launch.log_dir, exist_ok=True)
    return launch_job(launch)
  except exit_codes.PodrunError as e:
    print(f'launch_tpu_pod: error: {e}', file=sys.stderr)
    return e.exit_code
