"""`podrun-ray` (python -m launcher.ray): the job on a Ray cluster, one
process per node.

  podrun-ray --address=auto --num_processes=4 [--min_processes=3] \
      --resources_per_process='{"GPU": 8}' -- \
      --config=configs/mnist.py --workdir=/shared/runs/mnist

With --min_processes=K the job goes on without a node that dies, on as few
as K, and grows back when Ray has a node for a bundle again
(launcher/ray/elastic.py).

Everything after `--` is the launcher's flags, as for `podrun` on one host
(--local_devices too, for CPU devices). The workdir is one every node
reaches: a shared file system or a gs:// bucket.

The project (the current directory, or --project_dir) goes to every node as
Ray's working_dir, its files that git does not ignore and nothing else, and
each process runs from that copy: --config=my_config.py, the module
config.workload names and relative data paths mean there what they mean
here. podrun itself must be installed on every node (the ray extra).
"""

import argparse
import importlib.util
import json
import os
import sys
from typing import NoReturn

from launcher import restart_flags
from launcher.common import flag_values
from launcher.common import project
from launcher.ray import driver
from launcher.ray import options as options_lib
from runtime.common import exit_codes
from runtime.common import version
from runtime.common import layout


def _resources(text: str) -> dict[str, float]:
  try:
    value = json.loads(text)
  except ValueError as e:
    raise argparse.ArgumentTypeError(f'not JSON: {e}') from e
  if not (isinstance(value, dict) and value and all(
      isinstance(k, str) and isinstance(v, (int, float)) and v > 0
      for k, v in value.items())):
    raise argparse.ArgumentTypeError(
        f'{text}: give a JSON object of resource names and positive amounts, '
        'e.g. {"GPU": 8}')
  return {k: float(v) for k, v in value.items()}


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='podrun-ray',
      description='The job on a Ray cluster, one process '
      'per node; the launcher\'s flags follow `--`.')
  parser.add_argument('--address',
                      default='auto',
                      help="the Ray cluster: 'auto' or the head's HOST:PORT")
  parser.add_argument('--num_processes',
                      type=int,
                      required=True,
                      help='processes in the job, one per node')
  parser.add_argument('--min_processes',
                      type=int,
                      default=None,
                      help='an elastic job: go on at once without a node that '
                      'dies, on at least this many processes, and grow back '
                      'when Ray has a node for a bundle again')
  parser.add_argument('--min_replicas',
                      type=int,
                      default=None,
                      help='--min_processes counted in replicas, a process '
                      "each (replicated state, or config.replica='process' "
                      'with sharded state); give one of the two')
  parser.add_argument('--resources_per_process',
                      type=_resources,
                      default={'CPU': 1.0},
                      help='one process\'s bundle, as JSON: {"GPU": 8}, '
                      '{"TPU": 4}, {"CPU": 4}')
  parser.add_argument('--start_timeout',
                      type=float,
                      default=120.0,
                      help='seconds to wait for Ray to place every bundle')
  parser.add_argument('--stop_grace',
                      type=float,
                      default=30.0,
                      help='seconds the others have to end after a failure')
  restart_flags.add_to(parser)  # Each restart on a fresh placement group.
  parser.add_argument('--project_dir',
                      default='',
                      help='the project every process runs from, shipped '
                      "to each node as Ray's working_dir: its files that git "
                      'does not ignore (every file outside git); default '
                      'the current directory')
  parser.add_argument('--env',
                      action='append',
                      default=[],
                      metavar='KEY=VALUE',
                      help='a variable for the job\'s process on every node '
                      '(repeatable); the launching shell\'s variables do not '
                      'reach the nodes')
  parser.add_argument('--project_max_mb',
                      type=float,
                      default=project.DEFAULT_MAX_MB,
                      help='refuse a project over this many MiB before '
                      f'anything is uploaded (default '
                      f'{project.DEFAULT_MAX_MB:g})')
  return parser


def parse(argv: list[str]) -> options_lib.RayFlags:
  own, launcher_args = flag_values.LaunchArgs.split(argv)
  parser = _parser()
  args = parser.parse_args(own)
  if args.num_processes < 1:
    parser.error(f'--num_processes={args.num_processes}: at least 1')
  if args.min_processes is not None and args.min_replicas is not None:
    parser.error('--min_processes and --min_replicas count the same '
                 'processes: give one of them')
  minimum, flag = ((args.min_replicas,
                    '--min_replicas') if args.min_replicas is not None else
                   (args.min_processes, '--min_processes'))
  if minimum is not None and not 1 <= minimum <= args.num_processes:
    parser.error(f'{flag}={minimum} with --num_processes='
                 f'{args.num_processes}: it must be from 1 to '
                 f'{args.num_processes}')
  if not launcher_args:
    parser.error('no launcher flags after `--`: give at least --config')
  workdir = launcher_args.workdir
  if workdir is None:
    parser.error('no --workdir among the launcher flags: give one every node '
                 'reaches (a shared file system or gs://)')
  if not layout.in_bucket(workdir) and not os.path.isabs(workdir):
    parser.error(f'--workdir={workdir}: a relative path would land in each '
                 "node's own copy of the project: give one every node "
                 'reaches (an absolute path on a shared file system, or '
                 'gs://)')
  try:
    env = flag_values.env_pairs(args.env)
  except ValueError as e:
    parser.error(str(e))
  if args.project_max_mb <= 0:
    parser.error(f'--project_max_mb={args.project_max_mb:g}: must be '
                 'positive')
  try:
    restarts = restart_flags.policy_of(args.max_restarts, args.restart_backoff,
                                       args.retry_exit_codes)
  except ValueError as e:
    parser.error(str(e))
  return options_lib.RayFlags(args.address,
                              args.num_processes,
                              args.resources_per_process,
                              launcher_args,
                              start_timeout_s=args.start_timeout,
                              stop_grace_s=args.stop_grace,
                              restarts=restarts,
                              min_processes=minimum,
                              project_dir=args.project_dir,
                              project_max_mb=args.project_max_mb,
                              env=env)


def run() -> NoReturn:
  if sys.argv[1:2] == ['--version']:
    print(version.line('podrun-ray'))
    sys.exit(exit_codes.OK)
  options = parse(sys.argv[1:])
  if importlib.util.find_spec('ray') is None:
    print('podrun-ray: error: Ray is not installed: pip install -e ".[ray]"',
          file=sys.stderr)
    sys.exit(exit_codes.CONFIG_ERROR)
  sys.exit(driver.run(options))


if __name__ == '__main__':
  run()
