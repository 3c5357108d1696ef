"""`python -m launcher.tpu COMMAND ...` (or `podrun-tpu`): the TPU pod
driver's one entry.

  python -m launcher.tpu launch <the script's flags> -- <launcher flags>
  python -m launcher.tpu preflight --tpu=NAME --zone=ZONE [--project=P]
      [--wait_healthy=600] [--interval=10] -- <launcher flags>
  python -m launcher.tpu recoverable --tpu=NAME --zone=ZONE [--project=P]
  python -m launcher.tpu bundle --out=FILE.tar.gz [--project_dir=DIR]

`launch` is what scripts/launch_tpu_pod.sh runs (driver.py). `preflight`
prints the pod's PodInfo as one JSON line and exits 0, or exits 3 (not the
pod the config expects) or 6 (not up, or unreadable), naming both sides.
`recoverable` exits 0 when a relaunch makes sense and 6 when the pod is
preempted or terminated. `bundle` writes the code archive a launch copies
(podrun's code and the project) and prints its SHA-256.
"""

import argparse
import json
import sys
from typing import Sequence

from launcher.tpu import bundle
from launcher.tpu import driver
from launcher.tpu import preflight
from runtime.common import exit_codes
from runtime.common import version
from launcher.common import flag_values
from launcher.common import output_prefix
from launcher.common import project


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='podrun-tpu',
      description='The Cloud TPU pod driver. `podrun-tpu '
      'COMMAND --help` gives a command\'s flags.')
  sub = parser.add_subparsers(dest='command', required=True, metavar='COMMAND')
  # `launch` parses its own flags (flags.py); listed here for --help.
  sub.add_parser('launch',
                 add_help=False,
                 help='run a job on every worker '
                 'of a pod (what scripts/launch_tpu_pod.sh runs): '
                 '`podrun-tpu launch --help`')
  helps = {
      'preflight': 'check the pod through the Cloud TPU API: READY, '
                   'HEALTHY, the config\'s accelerator type',
      'recoverable': 'exit 0 when a relaunch makes sense, 6 when the '
                     'pod is preempted or terminated'
  }
  for name, text in helps.items():
    p = sub.add_parser(name, help=text, description=text)
    p.add_argument('--tpu', required=True, help='the TPU VM')
    p.add_argument('--zone', required=True, help='its zone')
    p.add_argument('--project', help="the Google Cloud project")
    if name == 'preflight':
      p.add_argument('--wait_healthy',
                     type=float,
                     default=600,
                     help='seconds to wait for READY and HEALTHY')
      p.add_argument('--interval',
                     type=float,
                     default=10,
                     help='seconds between two reads')
  text = ('write the code archive a launch copies (podrun\'s code and the '
          'project) and print its SHA-256')
  p = sub.add_parser('bundle', help=text, description=text)
  p.add_argument('--out', required=True, help='the .tar.gz to write')
  p.add_argument('--project_dir',
                 default='',
                 help='the project (default: '
                 'the current directory)')
  p.add_argument('--project_max_mb',
                 type=float,
                 default=project.DEFAULT_MAX_MB,
                 help='the cap on its size')
  return parser


def _check(args, launcher_args: Sequence[str]) -> int:
  """`preflight` and `recoverable`."""
  say = lambda m: print(f'tpu_pod: {m}', file=sys.stderr)
  if args.command == 'recoverable':
    try:
      ok, why = preflight.recoverable(
          preflight.make_client(args.tpu, args.zone, args.project))
    except preflight.MissingExtraError as e:
      say(f'error: {e}')
      return e.exit_code
    except Exception as e:  # pylint: disable=broad-except
      say(f'error: {preflight.explain_api_error(args.tpu, e)}')
      return exit_codes.POD_UNAVAILABLE
    say(f'TPU {args.tpu} {why}: '
        f'{"recoverable" if ok else "not recoverable; recreate it"}')
    return exit_codes.OK if ok else exit_codes.POD_UNAVAILABLE
  try:
    info = preflight.check(args.tpu,
                           args.zone,
                           args.project,
                           launcher_args,
                           args.wait_healthy,
                           args.interval,
                           log=say)
  except exit_codes.PodrunError as e:
    say(f'error: {e}')
    return e.exit_code
  print(json.dumps(info.as_dict()))
  return exit_codes.OK


def main(argv: list[str]) -> int:
  if argv[:1] == ['--version']:
    print(version.line('podrun-tpu'))
    return exit_codes.OK
  argv, launcher_args = flag_values.LaunchArgs.split(argv)
  output_prefix.quiet_routine_logs()
  if argv[:1] == ['launch']:
    return driver.main(argv[1:], launcher_args)
  args = _parser().parse_args(argv)
  if args.command == 'bundle':
    try:
      found = project.find(args.project_dir,
                           args.project_max_mb,
                           podrun_root=project.podrun_root())
    except exit_codes.PodrunError as e:
      print(f'podrun-tpu: error: {e}', file=sys.stderr)
      return e.exit_code
    print(bundle.bundle(args.out, found))
    return exit_codes.OK
  return _check(args, launcher_args)


def run() -> None:
  """The `podrun-tpu` command: `main` on the command line's arguments."""
  sys.exit(main(sys.argv[1:]))


if __name__ == '__main__':
  run()
