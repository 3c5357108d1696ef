"""Checks a Cloud TPU pod through the Cloud TPU API, before a launch and
after a failure.

`preflight` waits until the pod is READY and HEALTHY, then checks its
accelerator type against `config.topology.accelerator_type` (when the config
sets one) and its worker endpoints against the hosts that type implies;
`recoverable` says whether a relaunch on it makes sense. The API is read
over REST (launcher/tpu/tpu_api.py), with google-auth and requests, which
the `pod` extra installs.

Example:
  >>> client = make_client('my-pod', 'us-central2-b', None)
  >>> preflight(client, expected_type='v4-32', timeout_s=600).workers
  4
"""

import dataclasses
import time
from typing import Any, Callable, Optional, Sequence

from launcher.common import flag_values
from launcher.tpu import tpu_api
from runtime.common import accelerators
from runtime.common import exit_codes


class PodUnavailableError(exit_codes.PodrunError, RuntimeError):
  """The pod is not READY and HEALTHY in time, or cannot come back."""
  exit_code = exit_codes.POD_UNAVAILABLE


class PodMismatchError(exit_codes.PodrunError, RuntimeError):
  """The pod is not the one the config describes."""
  exit_code = exit_codes.TOPOLOGY_MISMATCH


@dataclasses.dataclass(frozen=True)
class PodInfo:
  """What the Cloud TPU API says of a pod that passed the preflight."""
  name: str
  state: str
  health: str
  accelerator_type: str
  workers: int
  endpoints: tuple[str, ...]
  expected: accelerators.SliceTopology

  def as_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out['expected'] = dataclasses.asdict(self.expected)
    return out


class MissingExtraError(exit_codes.ConfigError):
  """google-auth or requests is not installed: podrun's `pod` extra is
  missing."""


def make_client(tpu: str, zone: str, project: Optional[str]) -> tpu_api.Node:
  """The pod as the Cloud TPU API describes it (tpu_api.Node).

  Raises:
    MissingExtraError: without google-auth or requests, saying what to
      install.
  """
  try:
    import google.auth  # pylint: disable=g-import-not-at-top,unused-import
    import requests  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise MissingExtraError(
        f'the TPU preflight reads the pod through the Cloud TPU API with '
        f'google-auth and requests, which this Python ({e.name} missing) '
        'does not have: they come with podrun\'s pod extra. Install it with '
        '`pip install -e ".[pod]"` (scripts/launch_tpu_pod.sh does so in '
        '.venv), or skip the check with --skip_preflight.') from e
  return tpu_api.Node(tpu, zone, project)


def wait_until_ready(client,
                     timeout_s: float,
                     interval_s: float = 10,
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


def preflight(client,
              expected_type: Optional[str],
              timeout_s: float,
              interval_s: float = 10,
              **wait_kwargs) -> PodInfo:
  """Checks that the pod is up and is the pod the job expects.

  Args:
    client: a tpu_api.Node (or one with its methods).
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
  state, health = wait_until_ready(client, timeout_s, interval_s, **wait_kwargs)
  actual_type = client.accelerator_type()
  problems = []
  if expected_type and (expected_type.strip().lower() != (actual_type or
                                                          '').lower()):
    problems.append(
        f'accelerator type: config.topology.accelerator_type expects '
        f'{expected_type}, but TPU {client.name()} is {actual_type}')
  try:
    expected = accelerators.slice_topology(actual_type)
  except accelerators.AcceleratorTypeError as e:
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
  state = client.state()
  return bool(client.recoverable()), f'state={state} health={client.health()}'


def expected_accelerator_type(launcher_args: Sequence[str]) -> Optional[str]:
  """config.topology.accelerator_type of the launcher flags' --config.

  Reads --config=PATH[:ARG] and any --config.topology.accelerator_type=V
  override among the launcher flags; other overrides are left to the
  launcher itself.
  """
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  launcher_args = flag_values.LaunchArgs(launcher_args)
  if launcher_args.config is None:
    return None
  override = launcher_args.value('config.topology.accelerator_type')
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, '', flag_values=values)
  values(['launch_tpu_pod', f'--config={launcher_args.config}'])
  if override is not None:
    return override or None
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


def check(tpu: str,
          zone: str,
          project: Optional[str],
          launcher_args: Sequence[str],
          timeout_s: float,
          interval_s: float = 10,
          log: Callable[[str], None] = print) -> PodInfo:
  """`preflight` of the named pod for a job given these launcher flags.

  Raises:
    PodMismatchError: the pod is not the one the config expects.
    MissingExtraError: the pod extra is not installed.
    PodUnavailableError: the pod is not up in time, or cannot be read
      (credentials, network, the API), with what to do about it.
  """
  try:
    return preflight(make_client(tpu, zone, project or None),
                     expected_accelerator_type(launcher_args),
                     timeout_s,
                     interval_s,
                     log=log)
  except (PodMismatchError, MissingExtraError):
    raise
  except Exception as e:  # pylint: disable=broad-except
    # Credentials, network and API errors come in many types; all mean the
    # pod cannot be read, so nothing is launched.
    raise PodUnavailableError(explain_api_error(tpu, e)) from e
