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
from typing import Callable, Optional, Sequence

from launcher import restart
from launcher import restart_flags
from launcher.common import flag_values
from launcher.common import project as project_lib
from runtime.common import layout

_POD = 'The pod'
_TRAVELS = 'What travels to every worker'
_JOB = 'The job'
_RESTARTS = 'Restarts'
_FLEET = 'The fleet (--create: queued resources, babysitting, elastic slices)'
_CONTROL = 'Control (no job is started)'


def _flag(group: str, add: Optional[Callable] = None, **argparse_kwargs):
  """A PodFlags field that is a flag of its name: its `--help` group and
  argparse's keywords (its default and help among them), declared once
  beside the field; `add(group)` adds flags of its own (the restart
  flags, read together as one field)."""
  return dataclasses.field(metadata={
      'group': group,
      'add': add,
      'argparse': argparse_kwargs
  })


@dataclasses.dataclass(frozen=True)
class PodFlags:
  """The script's flags, read once and checked (`parse`): each field is the
  flag of its name, declared here once with its group, default and help
  (`_parser` builds the command line from the fields), but for those read
  together (`restarts`) and the derived (`tier`).

  Attributes:
    tier: 'spot', 'reserved' or 'on-demand' (--spot, --reserved).
  """
  tpu: str = _flag(_POD,
                   required=True,
                   help='the TPU VM (with --num_slices=N: the '
                   'slices are NAME-0 ... NAME-(N-1))')
  zone: str = _flag(_POD, required=True, help='its zone, e.g. us-central2-b')
  project: str = _flag(_POD,
                       default='',
                       help="the Google Cloud project (default: "
                       "gcloud's)")
  num_slices: int = _flag(_POD,
                          type=int,
                          default=1,
                          help='slices the one job runs on '
                          '(multislice; default 1)')
  megascale_port: int = _flag(_POD,
                              type=int,
                              default=8080,
                              help='the port the slices meet on (default 8080)')
  skip_preflight: bool = _flag(
      _POD,
      action='store_true',
      help='skip the Cloud TPU '
      'API check of READY, HEALTHY and the config\'s accelerator type')
  wait_healthy: float = _flag(
      _POD,
      type=float,
      default=600,
      help='seconds to wait for '
      'the slices to be READY and HEALTHY (default 600)')
  project_dir: str = _flag(
      _TRAVELS,
      default='',
      help='the project the job runs from on '
      'every worker: its files that git does not ignore (every file outside '
      'git) travel beside podrun\'s code (default: the current directory)')
  project_max_mb: float = _flag(
      _TRAVELS,
      type=float,
      default=project_lib.DEFAULT_MAX_MB,
      help='refuse a project over this many MiB before anything is copied '
      f'(default {project_lib.DEFAULT_MAX_MB:g})')
  worker_python: str = _flag(
      _TRAVELS,
      default='',
      help='the workers\' interpreter, used '
      'as it is: nothing is installed (default: python3.13 ... python3, '
      'with podrun installed into ~/podrun/venv)')
  provision_python: bool = _flag(
      _TRAVELS,
      action='store_true',
      help='install the Python '
      'this JAX needs (deadsnakes PPA, sudo apt-get) on workers that lack it')
  workdir: str = _flag(
      _JOB,
      default='',
      help='the launcher\'s --workdir; with '
      '--create, a gs:// bucket keeps the record past the slice')
  env: tuple[str, ...] = _flag(
      _JOB,
      action='append',
      default=[],
      metavar='KEY=VALUE',
      help='a variable for the job on every worker (repeatable)')
  job_id: str = _flag(_JOB,
                      default='',
                      help='the job\'s name on the workers (default '
                      'podrun-DATE-TIME-PID)')
  log_dir: str = _flag(_JOB,
                       default='',
                       help='where each worker\'s log goes (default '
                       'tpu_logs/JOB_ID)')
  log_all_workers: bool = _flag(
      _JOB,
      action='store_true',
      help='show every worker\'s '
      'lines on the console, not only worker 0\'s and the others\' errors')
  stop_grace: float = _flag(
      _JOB,
      type=float,
      default=60,
      help='seconds from SIGTERM '
      '(the job saves) to SIGKILL when a job is stopped (default 60)')
  orphan_timeout: float = _flag(
      _JOB,
      type=float,
      default=30,
      help='seconds a job runs '
      'on after its launching side is gone (default 30)')
  accelerator_devices: str = _flag(
      _JOB,
      default='/dev/accel*,/dev/vfio/*',
      help='the device files whose holders are named before a job starts '
      '(default /dev/accel*,/dev/vfio/*)')
  kill_accelerator_holders: bool = _flag(
      _JOB,
      action='store_true',
      help='stop a '
      'foreign process holding the accelerator rather than stopping there')
  replace: bool = _flag(
      _JOB,
      action='store_true',
      help='stop an earlier podrun job '
      'on the workers, and remove a stale libtpu lock, rather than stopping '
      'there')
  # --max_restarts, --restart_backoff and --retry_exit_codes, as every
  # launcher restarts a job (launcher/restart_flags.py).
  restarts: restart.RestartPolicy = _flag(_RESTARTS, restart_flags.add_to)
  create: bool = _flag(
      _FLEET,
      action='store_true',
      help='create the slices through a '
      'queued resource, wait for them, recreate one that is lost')
  queued_resource: str = _flag(_FLEET,
                               default='',
                               help='the queued resource\'s name '
                               '(default: --tpu)')
  accelerator_type: str = _flag(_FLEET,
                                default='',
                                help='with --create: e.g. v4-32')
  runtime_version: str = _flag(
      _FLEET,
      default='',
      help='with --create: the VM image, '
      'e.g. tpu-ubuntu2204-base (whose Python 3.10 needs --provision_python)')
  spot: bool = _flag(_FLEET,
                     action='store_true',
                     help='with --create: Spot VMs')
  reserved: bool = _flag(_FLEET,
                         action='store_true',
                         help='with --create: a reservation')
  valid_until: str = _flag(_FLEET,
                           default='',
                           help='with --create: give up waiting for '
                           'capacity after this long, e.g. 6h')
  delete_after: bool = _flag(_FLEET,
                             action='store_true',
                             help='with --create: delete '
                             'the slices when the job ends')
  capacity_timeout: float = _flag(_FLEET,
                                  type=float,
                                  default=24 * 3600,
                                  help='seconds '
                                  'to wait for capacity (default 86400)')
  provisioning_timeout: float = _flag(_FLEET,
                                      type=float,
                                      default=1800,
                                      help='seconds to '
                                      'wait for provisioning (default 1800)')
  poll_interval: float = _flag(_FLEET,
                               type=float,
                               default=10,
                               help='seconds between two '
                               'reads of the slices\' states (default 10)')
  # A Spot VM gets 30 s from the soft to the hard power-off: the job on a
  # lost slice may save in that time, and the delete would end it at once.
  lost_slice_wait: float = _flag(
      _FLEET,
      type=float,
      default=30,
      help='seconds a lost '
      'slice\'s job has to save before the slice is deleted (default 30)')
  # After a 75/143 from a spot slice whose node does not show it lost yet.
  relaunch_grace: float = _flag(
      _FLEET,
      type=float,
      default=15,
      help='seconds to watch a '
      'spot slice that still looks up after a shutdown exit before '
      'relaunching there (default 15)')
  min_slices: int = _flag(
      _FLEET,
      type=int,
      default=0,
      help='elastic: go on with this '
      'many slices or more while lost ones are recreated, then grow back')
  min_replicas: int = _flag(
      _FLEET,
      type=int,
      default=0,
      help='elastic, with sharded state: '
      'the same count as --min_slices, in replicas of the state, a slice '
      "each (config.replica='slice'; with 'process' each host is one, and a "
      'slice lost takes its hosts\' replicas whole); give one of the two')
  slice_back_backoff: float = _flag(
      _FLEET,
      type=float,
      default=60,
      help='seconds before '
      'a failed recreate is tried again, doubling to 10 min (default 60)')
  slice_back_timeout: float = _flag(
      _FLEET,
      type=float,
      default=24 * 3600,
      help='seconds '
      'to keep trying to recreate a lost slice (default 86400)')
  dry_run: bool = _flag(_CONTROL,
                        action='store_true',
                        help='print every command in '
                        'order; run none')
  status: bool = _flag(_CONTROL,
                       action='store_true',
                       help='show the jobs on the workers')
  stop: Optional[str] = _flag(
      _CONTROL,
      nargs='?',
      const='all',
      default=None,
      metavar='JOB_ID',
      help='stop a job on the workers (every podrun job without JOB_ID)')
  # Derived.
  tier: str = dataclasses.field(default='on-demand')


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='scripts/launch_tpu_pod.sh',
      usage='%(prog)s --tpu=NAME --zone=ZONE [flags] -- <launcher flags>',
      description='Runs a job on every worker of a Cloud TPU pod slice (or '
      'of several), from this machine; with --create, makes the slices '
      'first. The launcher\'s own flags (podrun --help) follow `--`.')
  groups = {}
  for field in dataclasses.fields(PodFlags):
    if 'group' not in field.metadata:
      continue  # Derived.
    title = field.metadata['group']
    if title not in groups:
      groups[title] = parser.add_argument_group(title)
    if field.metadata['add'] is not None:
      field.metadata['add'](groups[title])
    else:
      groups[title].add_argument(f'--{field.name}',
                                 **field.metadata['argparse'])
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
    missing = [
        f for f in ('accelerator_type', 'runtime_version')
        if not getattr(options, f)
    ]
    if missing:
      parser.error('--create needs ' + ' and '.join(f'--{f}' for f in missing))
  needs_create = [
      f for f in ('spot', 'reserved', 'valid_until', 'delete_after')
      if getattr(options, f)
  ]
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
  whose config does not fix the number of slices. --min_replicas=K says
  the same K (a replica a slice)."""
  if options.min_replicas:
    if options.min_slices:
      parser.error('--min_slices and --min_replicas count the same slices '
                   'here: give one of them')
    options.min_slices = options.min_replicas
  if not options.min_slices:
    return
  if not options.create:
    parser.error('--min_slices needs --create: the launch recreates the '
                 'slices it lost, and only its own')
  if not 1 <= options.min_slices < options.num_slices:
    parser.error(f'--min_slices={options.min_slices} with --num_slices='
                 f'{options.num_slices}: it must be from 1 to '
                 f'{options.num_slices - 1}')
  fixed = [
      f'--{name}={launcher_args.value(name)}'
      for name in ('config.topology.num_slices',
                   'config.topology.num_processes')
      if launcher_args.value(name) is not None
  ]
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
  where = (f'--workdir={workdir}'
           if workdir else "the launcher's default workdir (workdirs/CONFIG)")
  return (f'warning: {where} is on the VMs\' own disks, and its disks go '
          'with the slice: a preemption or --delete_after deletes the run\'s '
          'record (metrics, TensorBoard, summary.json, the goodput ledgers, '
          'the checkpoints unless config.checkpoint_dir is elsewhere). Put it '
          'in a bucket: --workdir=gs://BUCKET/RUN')


def parse(
    argv: list[str],
    launcher_args: Sequence[str]) -> tuple[PodFlags, flag_values.LaunchArgs]:
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
  options = PodFlags(
      **{
          **given, 'env': tuple(given['env']),
          'restarts': restarts,
          'tier': ('spot' if namespace.spot else 'reserved' if namespace.
                   reserved else 'on-demand'),
          'queued_resource': namespace.queued_resource or namespace.tpu
      })
  if options.workdir:
    launcher_args = launcher_args.with_workdir(options.workdir)
  return options, launcher_args
