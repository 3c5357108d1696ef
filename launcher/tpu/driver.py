"""Runs a job on every worker of a Cloud TPU pod, from the user's machine.

scripts/launch_tpu_pod.sh is the thin entry users type; this is what it
runs (`python -m launcher.tpu launch ...`). It never imports JAX. In
order:

0. with --create, asks for the slice(s) through a queued resource and waits
   through its phases, each with its own timeout (queued.py);
1. reads each slice with `gcloud ... describe` (its worker endpoints and
   accelerator type: the process count every worker must find) and, unless
   --skip_preflight, checks it through the Cloud TPU API (preflight.py, tpu_api.py);
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
   and restarts after a preemption under the job agent
   (launcher/agent.py, the local pod's restart policy), recreating a slice
   it created that was lost (babysit.py);
6. deletes the queued resource it created on a signal, when it never came
   up, and with --delete_after at the end.

What a launch knows is launch.py; --dry_run, --status and --stop are
control.py; the flags are flags.py. A bucket's record gets the launcher's
files from the driver after its last attempt
(launcher/common/launcher_record.py).
"""

import os
import signal
import sys
from typing import Sequence

from launcher import agent
from launcher import signals
from launcher.common import launcher_record
from launcher.common import project as project_lib
from launcher.tpu import attempt as attempt_lib
from launcher.tpu import control
from launcher.tpu import flags
from launcher.tpu import launch as launch_lib
from launcher.tpu import elastic as tpu_elastic
from launcher.tpu import queued
from launcher.tpu import slices as slices_lib
from runtime.common import exit_codes
from runtime.common import layout
from runtime.common import records


def _run(launch: launch_lib.Launch) -> int:
  """Creates the slice (--create), prepares the workers and runs the job
  with its restarts."""
  launch.slices.create()
  launch.slices.wait_up()
  launch.prepare()
  launch.stop_if_interrupted()
  return agent.run(
      agent.Job(start=lambda start: attempt_lib.Attempt(launch, start),
                restarts=launch.options.restarts,
                logs_dir=launch.log_dir,
                capacity=launch.slices,
                elastic=isinstance(launch.slices, tpu_elastic.SliceGroup),
                say=launch.say,
                on_signal=lambda signum: launch.on_signal(signum, None),
                pending_signal=lambda: launch.signals[0]
                if launch.signals else None))


def _clean_up(launch: launch_lib.Launch, code: int) -> None:
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


def _kept(launch: launch_lib.Launch, code: int) -> str:
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


def _job_record(launch: launch_lib.Launch, code: int) -> records.Job:
  """WORKDIR/logs/job.json of a TPU launch: where and how the job ran."""
  return records.Job(
      job_id=launch.job_id,
      launched_by='launch_tpu_pod',
      exit_code=code,
      launcher={
          'tpu': launch.options.tpu,
          'zone': launch.options.zone,
          'slices': list(launch.all_nodes),
          'workers_per_slice': launch.workers,
          'accelerator_type': launch.options.accelerator_type or None,
          'launcher_args': list(launch.launcher_args),
          'log_dir': launch.log_dir
      })


def launch_job(launch: launch_lib.Launch) -> int:
  """Runs the job with its restarts, deletes what should not be kept, and
  completes a bucket's record; returns the launch's exit code."""
  launch.say(f'job {launch.job_id}, logs in {launch.log_dir}')
  code: int = exit_codes.FAILED
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
  url = launch.launcher_args.workdir or ''
  if layout.in_bucket(url):
    # A workdir on the workers' disks is theirs to roll up.
    launcher_record.finish(layout.Record.of(url), launch.path(layout.ATTEMPTS),
                           _job_record(launch, code), launch.say)
  if code == exit_codes.OK:
    launch.say(f'job {launch.job_id} finished on every worker')
  else:
    launch.say(f'job {launch.job_id} ended with exit code {code} (logs: '
               f'{launch.log_dir})')
  return code


def main(argv: list[str], launcher_args: Sequence[str]) -> int:
  """`launch`: the script's flags in argv, the launcher's after `--`."""
  try:
    options, launcher_args = flags.parse(argv, launcher_args)
  except SystemExit as e:
    return exit_codes.CONFIG_ERROR if e.code else exit_codes.OK
  try:
    control_only = options.stop is not None or options.status
    project = None if control_only else project_lib.find(
        options.project_dir,
        options.project_max_mb,
        podrun_root=project_lib.podrun_root())
    launch = launch_lib.Launch(options, launcher_args, project)
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
