"""Checks a Cloud TPU pod before a launch and after a failure; bundles the code.

scripts/launch_tpu_pod.sh calls this module on the machine it runs on:

  python -m launcher.tpu_pod launch <the script's flags> -- <launcher flags>
  python -m launcher.tpu_pod preflight --tpu=NAME --zone=ZONE [--project=P]
      [--wait_healthy=600] -- <launcher flags>
  python -m launcher.tpu_pod recoverable --tpu=NAME --zone=ZONE [--project=P]
  python -m launcher.tpu_pod bundle --out=FILE.tar.gz

`preflight` reads the pod through cloud-tpu-client's `Client`: waits until it
is READY and HEALTHY, then checks its accelerator type against
`config.topology.accelerator_type` (when the config sets one) and its worker
endpoints against the hosts that type implies. It prints one JSON line and
exits 0, or exits with TOPOLOGY_MISMATCH (3) or POD_UNAVAILABLE (6) naming
both sides. `recoverable` exits 0 when a relaunch makes sense and 6 when the
pod is preempted or terminated. `bundle` writes the project's files (those
git does not ignore) into a reproducible tarball and prints its SHA-256.
"""

import dataclasses
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from typing import Any, Callable, Optional, Sequence

from launcher import exit_codes
from launcher import tpu_accelerators

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PodUnavailableError(RuntimeError):
  """The pod is not READY and HEALTHY in time, or cannot come back."""


class PodMismatchError(RuntimeError):
  """The pod is not the one the config describes."""


@dataclasses.dataclass(frozen=True)
class PodInfo:
  """What the Cloud TPU API says of a pod that passed the preflight."""
  name: str
  state: str
  health: str
  accelerator_type: str
  workers: int
  endpoints: tuple[str, ...]
  expected: tpu_accelerators.SliceTopology

  def as_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out['expected'] = dataclasses.asdict(self.expected)
    return out


def make_client(tpu: str, zone: str, project: Optional[str]):
  """cloud_tpu_client.Client for the pod (imported here: it defines a flag)."""
  import cloud_tpu_client  # pylint: disable=g-import-not-at-top
  return cloud_tpu_client.Client(tpu=tpu, zone=zone, project=project)


def wait_until_ready(client, timeout_s: float, interval_s: float = 10,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic,
                     log: Callable[[str], None] = print) -> tuple[str, str]:
  """Polls until the pod is READY and HEALTHY; returns (state, health).

  Raises:
    PodUnavailableError: at once for a PREEMPTED or TERMINATED pod, or after
      timeout_s, with the last state and health seen.
  """
  deadline = clock() + timeout_s
  while True:
    state, health = client.state(), client.health()
    if state in ('PREEMPTED', 'TERMINATED'):
      raise PodUnavailableError(
          f'TPU {client.name()} is {state}: it will not come back. Recreate '
          'it (gcloud compute tpus tpu-vm create, or your queued resource) '
          'and launch again.')
    if state == 'READY' and health == 'HEALTHY':
      return state, health
    if clock() + interval_s > deadline:
      raise PodUnavailableError(
          f'TPU {client.name()} is still state={state} health={health} after '
          f'{timeout_s:g} s (--wait_healthy); not launching. Look at it with '
          '`gcloud compute tpus tpu-vm describe`, or wait longer.')
    log(f'tpu_pod: waiting for {client.name()}: state={state} '
        f'health={health}')
    sleep(interval_s)


def preflight(client, expected_type: Optional[str], timeout_s: float,
              interval_s: float = 10, **wait_kwargs) -> PodInfo:
  """Checks that the pod is up and is the pod the job expects.

  Args:
    client: a cloud_tpu_client.Client (or one with its methods).
    expected_type: config.topology.accelerator_type, or None to accept the
      pod's own.
    timeout_s: how long to wait for READY and HEALTHY.
    interval_s: seconds between polls.

  Returns:
    The pod's PodInfo.

  Raises:
    PodUnavailableError: see wait_until_ready.
    PodMismatchError: naming the accelerator types, or the worker count
      against the hosts the type implies.
  """
  state, health = wait_until_ready(client, timeout_s, interval_s,
                                   **wait_kwargs)
  actual_type = client.accelerator_type()
  problems = []
  if expected_type and (expected_type.strip().lower() !=
                        (actual_type or '').lower()):
    problems.append(
        f'accelerator type: config.topology.accelerator_type expects '
        f'{expected_type}, but TPU {client.name()} is {actual_type}')
  try:
    expected = tpu_accelerators.slice_topology(actual_type)
  except tpu_accelerators.AcceleratorTypeError as e:
    raise PodMismatchError(f'TPU {client.name()}: {e}') from e
  endpoints = tuple(f'{e.get("ipAddress")}:{e.get("port")}'
                    for e in client.network_endpoints())
  if len(endpoints) != expected.hosts:
    problems.append(
        f'workers: {actual_type} has {expected.hosts} host(s) '
        f'({expected.describe()}), but TPU {client.name()} lists '
        f'{len(endpoints)} worker endpoint(s): {", ".join(endpoints)}')
  if problems:
    raise PodMismatchError(
        f'TPU {client.name()} is not the pod this job expects '
        f'({len(problems)} problem(s)):\n  - ' + '\n  - '.join(problems) +
        '\nFix config.topology.accelerator_type (or drop it), or launch on '
        'the pod it names. Nothing was started.')
  return PodInfo(client.name(), state, health, actual_type, len(endpoints),
                 endpoints, expected)


def recoverable(client) -> tuple[bool, str]:
  """Whether relaunching on this pod can work, and why (its state)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    # Client.recoverable reads its own --runtime_oom_exit flag.
    flags.FLAGS.mark_as_parsed()
  state = client.state()
  return bool(client.recoverable()), f'state={state} health={client.health()}'


def project_files(repo: str = REPO) -> list[str]:
  """The files git does not ignore (tracked and untracked), sorted."""
  try:
    out = subprocess.run(
        ['git', '-C', repo, 'ls-files', '-z', '--cached', '--others',
         '--exclude-standard'], check=True, capture_output=True).stdout
  except (OSError, subprocess.CalledProcessError) as e:
    raise RuntimeError(f'cannot list the project files of {repo} with git '
                       f'(needed to honour .gitignore): {e}') from e
  names = sorted({n for n in out.decode().split('\0') if n})
  return [n for n in names if os.path.isfile(os.path.join(repo, n))]


def bundle(out: str, repo: str = REPO) -> str:
  """Writes the project's files to a reproducible .tar.gz; returns its sha256.

  The same files give the same bytes (fixed owner, mode and time), so the
  hash names the code: every worker of a launch runs the same.
  """
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode='w', format=tarfile.PAX_FORMAT) as tar:
    for name in project_files(repo):
      path = os.path.join(repo, name)
      info = tarfile.TarInfo(name)
      info.size = os.path.getsize(path)
      info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
      info.mtime = 0
      with open(path, 'rb') as f:
        tar.addfile(info, f)
  data = gzip.compress(buffer.getvalue(), mtime=0)
  with open(out, 'wb') as f:
    f.write(data)
  return hashlib.sha256(data).hexdigest()


def expected_accelerator_type(launcher_args: Sequence[str]) -> Optional[str]:
  """config.topology.accelerator_type of the launcher flags' --config.

  Reads --config=PATH[:ARG] and any --config.topology.accelerator_type=V
  override among the launcher flags; other overrides are left to the
  launcher itself.
  """
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  config_args = [a for a in launcher_args if a.startswith('--config=')]
  if not config_args:
    return None
  override = [a.split('=', 1)[1] for a in launcher_args
              if a.startswith('--config.topology.accelerator_type=')]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, '', flag_values=values)
  values(['tpu_pod', config_args[-1]])
  if override:
    return override[-1] or None
  topology = values.config.get('topology') or {}
  return topology.get('accelerator_type')


def explain_api_error(tpu: str, error: Exception) -> str:
  """One message for a failure to read the pod through the Cloud TPU API."""
  if 'DefaultCredentialsError' in type(error).__name__ or (
      'default credentials' in str(error).lower()):
    return (f'cannot read TPU {tpu} through the Cloud TPU API: no '
            'Application Default Credentials. Run `gcloud auth '
            'application-default login` on this machine (a logged-in gcloud '
            'is not enough), or skip this check with --skip_preflight.')
  if isinstance(error, PodUnavailableError):
    return str(error)
  return (f'cannot read TPU {tpu} through the Cloud TPU API: '
          f'{type(error).__name__}: {error}')


def _main(argv: list[str]) -> int:
  if argv[:1] == ['launch']:
    from launcher import pod_driver  # pylint: disable=g-import-not-at-top
    return pod_driver.main(argv[1:])
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(prog='python -m launcher.tpu_pod')
  sub = parser.add_subparsers(dest='command', required=True)
  for name in ('preflight', 'recoverable'):
    p = sub.add_parser(name)
    p.add_argument('--tpu', required=True)
    p.add_argument('--zone', required=True)
    p.add_argument('--project')
    if name == 'preflight':
      p.add_argument('--wait_healthy', type=float, default=600)
      p.add_argument('--interval', type=float, default=10)
  p = sub.add_parser('bundle')
  p.add_argument('--out', required=True)
  launcher_args = []
  if '--' in argv:
    argv, launcher_args = argv[:argv.index('--')], argv[argv.index('--') + 1:]
  args = parser.parse_args(argv)

  if args.command == 'bundle':
    print(bundle(args.out))
    return exit_codes.OK
  try:
    client = make_client(args.tpu, args.zone, args.project)
    if args.command == 'recoverable':
      ok, why = recoverable(client)
      print(f'tpu_pod: TPU {args.tpu} {why}: '
            f'{"recoverable" if ok else "not recoverable; recreate it"}',
            file=sys.stderr)
      return exit_codes.OK if ok else exit_codes.POD_UNAVAILABLE
    info = preflight(client, expected_accelerator_type(launcher_args),
                     args.wait_healthy, args.interval,
                     log=lambda m: print(m, file=sys.stderr))
  except PodMismatchError as e:
    print(f'tpu_pod: error: {e}', file=sys.stderr)
    return exit_codes.TOPOLOGY_MISMATCH
  except Exception as e:  # pylint: disable=broad-except
    # Credentials, network and API errors come in many types; all mean the
    # pod cannot be read, so nothing is launched.
    print(f'tpu_pod: error: {explain_api_error(args.tpu, e)}',
          file=sys.stderr)
    return exit_codes.POD_UNAVAILABLE
  print(json.dumps(info.as_dict()))
  return exit_codes.OK


if __name__ == '__main__':
  sys.exit(_main(sys.argv[1:]))
