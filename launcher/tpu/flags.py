"""scripts/launch_tpu_pod.sh's flags: parsed and checked before anything runs.

Example:
  >>> options, launcher_args = parse(
  ...     ['--tpu=run7', '--zone=us-central2-b', '--create',
  ...      '--accelerator_type=v4-32', '--runtime_version=tpu-ubuntu2204-base',
  ...      '--spot'], ['--config=configs/mnist.py'])
  >>> options.tier
  'spot'
"""

import argparse
import dataclasses
import re
from typing import Optional, Sequence

from launcher import restart
from launcher import restart_flags
from launcher.common import flag_values
from launcher.common import project as project_lib
from runtime.common import layout


@dataclasses.dataclass(frozen=True)
class PodFlags:
  """The script's flags, read once and checked (`parse`); each is the flag
  of its name (`--help`, which holds the defaults), but for those read
  together.

  Attributes:
    restarts: --max_restarts, --restart_backoff and --retry_exit_codes,
      as every launcher restarts a job.
    tier: 'spot', 'reserved' or 'on-demand' (--spot, --reserved).
    queued_resource: the queued resource's name (--queued_resource, else
      --tpu).
  """
  # The pod.
  tpu: str
  zone: str
  project: str
  num_slices: int
  megascale_port: int
  skip_preflight: bool
  wait_healthy: float
  # What travels to every worker.
  project_dir: str
  project_max_mb: float
  worker_python: str
  provision_python: bool
  # The job.
  workdir: str
  env: tuple[str, ...]
  job_id: str
  log_dir: str
  log_all_workers: bool
  stop_grace: float
  orphan_timeout: float
  accelerator_devices: str
  kill_accelerator_holders: bool
  replace: bool
  # Restarts.
  restarts: restart.RestartPolicy
  # The fleet.
  create: bool
  queued_resource: str
  accelerator_type: str
  runtime_version: str
  spot: bool
  reserved: bool
  valid_until: str
  delete_after: bool
  capacity_timeout: float
  provisioning_timeout: float
  poll_interval: float
  lost_slice_wait: float
  relaunch_grace: float
  min_slices: int
  slice_back_backoff: float
  slice_back_timeout: float
  # Control.
  dry_run: bool
  status: bool
  stop: Optional[str]
  # Derived.
  tier: str


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='scripts/launch_tpu_pod.sh',
      usage='%(prog)s --tpu=NAME --zone=ZONE [flags] -- <launcher flags>',
      description='Runs a job on every worker of a Cloud TPU pod slice (or '
      'of several), from this machine; with --create, makes the slices '
      'first. The launcher\'s own flags (podrun --help) follow `--`.')
  group = parser.add_argument_group('The pod')
  add = group.add_argument
  add('--tpu', required=True, help='the TPU VM (with --num_slices=N: the '
      'slices are NAME-0 ... NAME-(N-1))')
  add('--zone', required=True, help='its zone, e.g. us-central2-b')
  add('--project', default='', help="the Google Cloud project (default: "
      "gcloud's)")
  add('--num_slices', type=int, default=1, help='slices the one job runs on '
      '(multislice; default 1)')
  add('--megascale_port', type=int, default=8080,
      help='the port the slices meet on (default 8080)')
  add('--skip_preflight', action='store_true', help='skip the Cloud TPU '
      'API check of READY, HEALTHY and the config\'s accelerator type')
  add('--wait_healthy', type=float, default=600, help='seconds to wait for '
      'the slices to be READY and HEALTHY (default 600)')
  group = parser.add_argument_group('What travels to every worker')
  add = group.add_argument
  add('--project_dir', default='', help='the project the job runs from on '
      'every worker: its files that git does not ignore (every file outside '
      'git) travel beside podrun\'s code (default: the current directory)')
  add('--project_max_mb', type=float, default=project_lib.DEFAULT_MAX_MB,
      help='refuse a project over this many MiB before anything is copied '
      f'(default {project_lib.DEFAULT_MAX_MB:g})')
  add('--worker_python', default='', help='the workers\' interpreter, used '
      'as it is: nothing is installed (default: python3.13 ... python3, '
      'with podrun installed into ~/podrun/venv)')
  add('--provision_python', action='store_true', help='install the Python '
      'this JAX needs (deadsnakes PPA, sudo apt-get) on workers that lack it')
  group = parser.add_argument_group('The job')
  add = group.add_argument
  add('--workdir', default='', help='the launcher\'s --workdir; with '
      '--create, a gs:// bucket keeps the record past the slice')
  add('--env', action='append', default=[], metavar='KEY=VALUE',
      help='a variable for the job on every worker (repeatable)')
  add('--job_id', default='', help='the job\'s name on the workers (default '
      'podrun-DATE-TIME-PID)')
  add('--log_dir', default='', help='where each worker\'s log goes (default '
      'tpu_logs/JOB_ID)')
  add('--log_all_workers', action='store_true', help='show every worker\'s '
      'lines on the console, not only worker 0\'s and the others\' errors')
  add('--stop_grace', type=float, default=60, help='seconds from SIGTERM '
      '(the job saves) to SIGKILL when a job is stopped (default 60)')
  add('--orphan_timeout', type=float, default=30, help='seconds a job runs '
      'on after its launching side is gone (default 30)')
  add('--accelerator_devices', default='/dev/accel*,/dev/vfio/*',
      help='the device files whose holders are named before a job starts '
      '(default /dev/accel*,/dev/vfio/*)')
  add('--kill_accelerator_holders', action='store_true', help='stop a '
      'foreign process holding the accelerator rather than stopping there')
  add('--replace', action='store_true', help='stop an earlier podrun job '
      'on the workers, and remove a stale libtpu lock, rather than stopping '
      'there')
  group = parser.add_argument_group('Restarts')
  add = group.add_argument
  restart_flags.add_to(group)
  group = parser.add_argument_group(
      'The fleet (--create: queued resources, babysitting, elastic slices)')
  add = group.add_argument
  add('--create', action='store_true', help='create the slices through a '
      'queued resource, wait for them, recreate one that is lost')
  add('--queued_resource', default='', help='the queued resource\'s name '
      '(default: --tpu)')
  add('--accelerator_type', default='', help='with --create: e.g. v4-32')
  add('--runtime_version', default='', help='with --create: the VM image, '
      'e.g. tpu-ubuntu2204-base (whose Python 3.10 needs --provision_python)')
  add('--spot', action='store_true', help='with --create: Spot VMs')
  add('--reserved', action='store_true', help='with --create: a reservation')
  add('--valid_until', default='', help='with --create: give up waiting for '
      'capacity after this long, e.g. 6h')
  add('--delete_after', action='store_true', help='with --create: delete '
      'the slices when the job ends')
  add('--capacity_timeout', type=float, default=24 * 3600, help='seconds '
      'to wait for capacity (default 86400)')
  add('--provisioning_timeout', type=float, default=1800, help='seconds to '
      'wait for provisioning (default 1800)')
  add('--poll_interval', type=float, default=10, help='seconds between two '
      'reads of the slices\' states (default 10)')
  # A Spot VM gets 30 s from the soft to the hard power-off: the job on a
  # lost slice may save in that time, and the delete would end it at once.
  add('--lost_slice_wait', type=float, default=30, help='seconds a lost '
      'slice\'s job has to save before the slice is deleted (default 30)')
  # After a 75/143 from a spot slice whose node does not show it lost yet.
  add('--relaunch_grace', type=float, default=15, help='seconds to watch a '
      'spot slice that still looks up after a shutdown exit before '
      'relaunching there (default 15)')
  add('--min_slices', type=int, default=0, help='elastic: go on with this '
      'many slices or more while lost ones are recreated, then grow back')
  add('--slice_back_backoff', type=float, default=60, help='seconds before '
      'a failed recreate is tried again, doubling to 10 min (default 60)')
  add('--slice_back_timeout', type=float, default=24 * 3600, help='seconds '
      'to keep trying to recreate a lost slice (default 86400)')
  group = parser.add_argument_group('Control (no job is started)')
  add = group.add_argument
  add('--dry_run', action='store_true', help='print every command in '
      'order; run none')
  add('--status', action='store_true', help='show the jobs on the workers')
  add('--stop', nargs='?', const='all', default=None, metavar='JOB_ID',
      help='stop a job on the workers (every podrun job without JOB_ID)')
  return parser


def _check(parser: argparse.ArgumentParser, options, launcher_args) -> None:
  if not re.fullmatch(r'[A-Za-z0-9._-]*', options.job_id):
    parser.error("--job_id may hold letters, digits, '.', '_' and '-' only")
  try:
    flag_values.env_pairs(options.env)
  except ValueError as e:
    parser.error(str(e))
  control = options.stop is not None or options.status
  if not launcher_args and not control:
    parser.error('give the launcher flags after --, e.g. -- '
                 '--config=configs/linear_regression.py')
  if options.spot and options.reserved:
    parser.error('--spot and --reserved: choose one (neither: on demand)')
  if options.project_max_mb <= 0:
    parser.error(f'--project_max_mb={options.project_max_mb:g}: must be '
                 'positive')
  if options.num_slices < 1:
    parser.error(f'--num_slices={options.num_slices}: at least 1')
  _check_elastic(parser, options, launcher_args)
  if options.create and not control:
    missing = [f for f in ('accelerator_type', 'runtime_version')
               if not getattr(options, f)]
    if missing:
      parser.error('--create needs ' + ' and '.join(f'--{f}' for f in missing))
  needs_create = [f for f in ('spot', 'reserved', 'valid_until',
                              'delete_after') if getattr(options, f)]
  if needs_create and not options.create:
    parser.error(' '.join(f'--{f}' for f in needs_create) + ' go(es) with '
                 '--create (a slice this launch creates)')
  for name in ('poll_interval', 'capacity_timeout', 'provisioning_timeout',
               'slice_back_backoff'):
    if getattr(options, name) <= 0:
      parser.error(f'--{name} must be positive')
  for name in ('lost_slice_wait', 'relaunch_grace', 'slice_back_timeout'):
    if getattr(options, name) < 0:
      parser.error(f'--{name} must be 0 or more')


def _check_elastic(parser: argparse.ArgumentParser, options,
                   launcher_args) -> None:
  """--min_slices=K needs --create and 1 <= K < --num_slices, and a job
  whose config does not fix the number of slices."""
  if not options.min_slices:
    return
  if not options.create:
    parser.error('--min_slices needs --create: the launch recreates the '
                 'slices it lost, and only its own')
  if not 1 <= options.min_slices < options.num_slices:
    parser.error(f'--min_slices={options.min_slices} with --num_slices='
                 f'{options.num_slices}: it must be from 1 to '
                 f'{options.num_slices - 1}')
  fixed = [f'--{name}={launcher_args.value(name)}'
           for name in ('config.topology.num_slices',
                        'config.topology.num_processes')
           if launcher_args.value(name) is not None]
  if fixed:
    parser.error(f'{fixed[0]} fixes what --min_slices lets change: drop it')


def local_workdir_warning(options: PodFlags,
                          launcher_args: flag_values.LaunchArgs) -> str:
  """A loud warning when a slice this launch creates would take the run's
  record with it ('' when the workdir is in a bucket, or nothing is
  created)."""
  workdir = launcher_args.workdir or ''
  if not options.create or layout.in_bucket(workdir):
    return ''
  where = (f'--workdir={workdir}' if workdir else
           "the launcher's default workdir (workdirs/CONFIG)")
  return (f'warning: {where} is on the VMs\' own disks, and its disks go '
          'with the slice: a preemption or --delete_after deletes the run\'s '
          'record (metrics, TensorBoard, summary.json, the goodput ledgers, '
          'the checkpoints unless config.checkpoint_dir is elsewhere). Put it '
          'in a bucket: --workdir=gs://BUCKET/RUN')


def parse(argv: list[str], launcher_args: Sequence[str]
          ) -> tuple[PodFlags, flag_values.LaunchArgs]:
  """The script's flags, and the launcher flags (those after `--`, with
  --workdir added when the script got one).

  Raises:
    SystemExit: as argparse does, for --help or a flag refused.
  """
  launcher_args = flag_values.LaunchArgs(launcher_args)
  parser = _parser()
  namespace = parser.parse_args(argv)
  _check(parser, namespace, launcher_args)
  given = vars(namespace)
  try:
    restarts = restart_flags.policy_of(
        *(given.pop(name) for name, *_ in restart_flags.FLAGS))
  except ValueError as e:
    parser.error(str(e))
  options = PodFlags(**{
      **given, 'env': tuple(given['env']), 'restarts': restarts,
      'tier': ('spot' if namespace.spot else
               'reserved' if namespace.reserved else 'on-demand'),
      'queued_resource': namespace.queued_resource or namespace.tpu})
  if options.workdir:
    launcher_args = launcher_args.with_workdir(options.workdir)
  return options, launcher_args
