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
import re

from launcher.common import flag_values


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog='scripts/launch_tpu_pod.sh')
  add = parser.add_argument
  add('--tpu', required=True)
  add('--zone', required=True)
  add('--project', default='')
  add('--workdir', default='')
  add('--env', action='append', default=[])
  add('--max_restarts', type=int, default=0)
  add('--retry_exit_codes', default='')
  add('--restart_backoff', type=float, default=1.0)
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
  add('--log_all_workers', action='store_true')
  # The fleet: queued resources, babysitting, multislice.
  add('--create', action='store_true')
  add('--queued_resource', default='')
  add('--accelerator_type', default='')
  add('--runtime_version', default='')
  add('--spot', action='store_true')
  add('--reserved', action='store_true')
  add('--valid_until', default='')
  add('--delete_after', action='store_true')
  add('--capacity_timeout', type=float, default=24 * 3600)
  add('--provisioning_timeout', type=float, default=1800)
  add('--poll_interval', type=float, default=10)
  # A Spot VM gets 30 s from the soft to the hard power-off: the job on a
  # lost slice may save in that time, and the delete would end it at once.
  add('--lost_slice_wait', type=float, default=30)
  # After a 75/143 from a spot slice whose node does not show it lost yet.
  add('--relaunch_grace', type=float, default=15)
  add('--num_slices', type=int, default=1)
  # Elastic: go on with this many slices or more while others come back.
  add('--min_slices', type=int, default=0)
  # A lost slice whose recreate fails is tried again after this many
  # seconds, doubling (at most 10 min), until --slice_back_timeout.
  add('--slice_back_backoff', type=float, default=60)
  add('--slice_back_timeout', type=float, default=24 * 3600)
  add('--megascale_port', type=int, default=8080)
  # Accelerator preflight on every worker.
  add('--accelerator_devices', default='/dev/accel*,/dev/vfio/*')
  add('--kill_accelerator_holders', action='store_true')
  return parser


def _check(parser: argparse.ArgumentParser, options, launcher_args) -> None:
  if not re.fullmatch(r'[A-Za-z0-9._-]*', options.job_id):
    parser.error("--job_id may hold letters, digits, '.', '_' and '-' only")
  for pair in options.env:
    if not re.match(r'^[A-Za-z_][A-Za-z0-9_]*=', pair):
      parser.error(f'--env {pair}: expected KEY=VALUE with KEY a variable '
                   'name')
  control = options.stop is not None or options.status
  if not launcher_args and not control:
    parser.error('give the launcher flags after --, e.g. -- '
                 '--config=configs/linear_regression.py')
  if options.spot and options.reserved:
    parser.error('--spot and --reserved: choose one (neither: on demand)')
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
  fixed = [a for a in launcher_args
           if a.startswith(('--config.topology.num_slices=',
                            '--config.topology.num_processes='))]
  if fixed:
    parser.error(f'{fixed[0]} fixes what --min_slices lets change: drop it')


def local_workdir_warning(options, launcher_args: list[str]) -> str:
  """A loud warning when a slice this launch creates would take the run's
  record with it ('' when the workdir is in a bucket, or nothing is
  created)."""
  workdir = flag_values.workdir_of(launcher_args) or ''
  if not options.create or workdir.startswith('gs://'):
    return ''
  where = (f'--workdir={workdir}' if workdir else
           "the launcher's default workdir (workdirs/CONFIG)")
  return (f'warning: {where} is on the VMs\' own disks, and its disks go '
          'with the slice: a preemption or --delete_after deletes the run\'s '
          'record (metrics, TensorBoard, summary.json, the goodput ledgers, '
          'the checkpoints unless config.checkpoint_dir is elsewhere). Put it '
          'in a bucket: --workdir=gs://BUCKET/RUN')


def parse(argv: list[str], launcher_args: list[str]
          ) -> tuple[argparse.Namespace, list[str]]:
  """The script's flags, and the launcher flags (those after `--`).

  Adds `options.tier` ('spot', 'reserved' or 'on-demand') and
  `options.queued_resource` (default: the --tpu name).
  """
  launcher_args = list(launcher_args)
  parser = _parser()
  options = parser.parse_args(argv)
  _check(parser, options, launcher_args)
  options.tier = ('spot' if options.spot else
                  'reserved' if options.reserved else 'on-demand')
  options.queued_resource = options.queued_resource or options.tpu
  if options.workdir:
    launcher_args.append(f'--workdir={options.workdir}')
  return options, launcher_args
