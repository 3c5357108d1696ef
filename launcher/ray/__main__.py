"""`podrun-ray` (python -m launcher.ray): the job on a Ray cluster, one
process per node.

  podrun-ray --address=auto --num_processes=4 \
      --resources_per_process='{"GPU": 8}' -- \
      --config=configs/mnist.py --workdir=/shared/runs/mnist

Everything after `--` is the launcher's flags, as for `podrun` on one host
(--local_devices too, for CPU devices). The workdir is one every node
reaches: a shared file system or a gs:// bucket.
"""

import argparse
import importlib.util
import json
import sys
from typing import NoReturn

from launcher.ray import driver
from runtime.common import exit_codes


def split_launcher_args(argv: list[str]) -> tuple[list[str], list[str]]:
  """(argv before `--`, the launcher flags after it)."""
  if '--' not in argv:
    return argv, []
  at = argv.index('--')
  return argv[:at], argv[at + 1:]


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
      prog='podrun-ray', description='The job on a Ray cluster, one process '
      'per node; the launcher\'s flags follow `--`.')
  parser.add_argument('--address', default='auto',
                      help="the Ray cluster: 'auto' or the head's HOST:PORT")
  parser.add_argument('--num_processes', type=int, required=True,
                      help='processes in the job, one per node')
  parser.add_argument('--resources_per_process', type=_resources,
                      default={'CPU': 1.0},
                      help='one process\'s bundle, as JSON: {"GPU": 8}, '
                      '{"TPU": 4}, {"CPU": 4}')
  parser.add_argument('--start_timeout', type=float, default=120.0,
                      help='seconds to wait for Ray to place every bundle')
  parser.add_argument('--stop_grace', type=float, default=30.0,
                      help='seconds the others have to end after a failure')
  return parser


def parse(argv: list[str]) -> driver.Options:
  own, launcher_args = split_launcher_args(argv)
  parser = _parser()
  args = parser.parse_args(own)
  if args.num_processes < 1:
    parser.error(f'--num_processes={args.num_processes}: at least 1')
  if not launcher_args:
    parser.error('no launcher flags after `--`: give at least --config')
  return driver.Options(args.address, args.num_processes,
                        args.resources_per_process, launcher_args,
                        start_timeout_s=args.start_timeout,
                        stop_grace_s=args.stop_grace)


def run() -> NoReturn:
  options = parse(sys.argv[1:])
  if importlib.util.find_spec('ray') is None:
    print('podrun-ray: error: Ray is not installed: pip install -e ".[ray]"',
          file=sys.stderr)
    sys.exit(exit_codes.CONFIG_ERROR)
  sys.exit(driver.run(options))


if __name__ == '__main__':
  run()
