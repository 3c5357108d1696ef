"""`python -m launcher.tpu COMMAND ...` (or `podrun-tpu`): the TPU pod
driver's one entry.

  python -m launcher.tpu launch <the script's flags> -- <launcher flags>
  python -m launcher.tpu preflight --tpu=NAME --zone=ZONE [--project=P]
      [--wait_healthy=600] [--interval=10] -- <launcher flags>
  python -m launcher.tpu recoverable --tpu=NAME --zone=ZONE [--project=P]
  python -m launcher.tpu bundle --out=FILE.tar.gz

`launch` is what scripts/launch_tpu_pod.sh runs (driver.py). `preflight`
prints the pod's PodInfo as one JSON line and exits 0, or exits 3 (not the
pod the config expects) or 6 (not up, or unreadable), naming both sides.
`recoverable` exits 0 when a relaunch makes sense and 6 when the pod is
preempted or terminated. `bundle` writes the project's tarball and prints its
SHA-256.
"""

import argparse
import json
import sys

from launcher.tpu import bundle
from launcher.tpu import driver
from launcher.tpu import preflight
from runtime.common import exit_codes
from launcher.common import output_prefix


def split_launcher_args(argv: list[str]) -> tuple[list[str], list[str]]:
  """(argv before `--`, the launcher flags after it)."""
  if '--' not in argv:
    return argv, []
  at = argv.index('--')
  return argv[:at], argv[at + 1:]


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog='python -m launcher.tpu')
  sub = parser.add_subparsers(dest='command', required=True)
  for name in ('preflight', 'recoverable'):
    p = sub.add_parser(name)
    p.add_argument('--tpu', required=True)
    p.add_argument('--zone', required=True)
    p.add_argument('--project')
    if name == 'preflight':
      p.add_argument('--wait_healthy', type=float, default=600)
      p.add_argument('--interval', type=float, default=10)
  sub.add_parser('bundle').add_argument('--out', required=True)
  return parser


def _check(args, launcher_args: list[str]) -> int:
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
    info = preflight.check(args.tpu, args.zone, args.project, launcher_args,
                           args.wait_healthy, args.interval, log=say)
  except exit_codes.PodrunError as e:
    say(f'error: {e}')
    return e.exit_code
  print(json.dumps(info.as_dict()))
  return exit_codes.OK


def main(argv: list[str]) -> int:
  argv, launcher_args = split_launcher_args(argv)
  output_prefix.quiet_routine_logs()
  if argv[:1] == ['launch']:
    return driver.main(argv[1:], launcher_args)
  args = _parser().parse_args(argv)
  if args.command == 'bundle':
    print(bundle.bundle(args.out))
    return exit_codes.OK
  return _check(args, launcher_args)


def run() -> None:
  """The `podrun-tpu` command: `main` on the command line's arguments."""
  sys.exit(main(sys.argv[1:]))


if __name__ == '__main__':
  run()
