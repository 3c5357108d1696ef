"""The slices a launch creates through a queued resource, waits for and deletes.

With --create, scripts/launch_tpu_pod.sh asks Cloud TPU for its slice(s)
with `gcloud compute tpus queued-resources create` and follows the request
through its states. Each phase has a deadline of its own, counted from the
moment the phase began, so that a create which is slow but still moving is
never taken for a failed one:

  capacity      ACCEPTED, WAITING_FOR_RESOURCES   --capacity_timeout
  provisioning  PROVISIONING                      --provisioning_timeout
  ready         ACTIVE, until every node is READY and HEALTHY
                                                  --wait_healthy

A queued resource FAILED, SUSPENDING or SUSPENDED, or a node PREEMPTED or
TERMINATED, is a slice that is gone: babysitting deletes it and creates it
again under the same name (driver.py). Only what this launch asked for is
ever deleted.

Example:
  >>> request = Request('run7', ('run7',), 'v4-32', 'tpu-ubuntu2204-base',
  ...                   tier='spot')
  >>> request.create_args()[:3]
  ['run7', '--accelerator-type=v4-32', '--runtime-version=tpu-ubuntu2204-base']
"""

import dataclasses
import json
import re
import shlex
import subprocess
import time
from typing import Callable, Optional

from launcher.tpu import commands
from launcher.tpu.commands import LaunchError
from runtime.common import exit_codes

WAITING = ('CREATING', 'ACCEPTED', 'WAITING_FOR_RESOURCES')
LOST = ('FAILED', 'SUSPENDING', 'SUSPENDED', 'DELETING')
NODE_LOST = ('PREEMPTED', 'TERMINATED', 'STOPPED', 'STOPPING', 'DELETING')
# `gcloud ... describe` of something that does not exist.
NOT_FOUND = 'NOT_FOUND'
# Reads in a row that may fail while waiting before the launch gives up.
_READ_ATTEMPTS = 5


class Interrupted(Exception):
  """SIGINT or SIGTERM reached the launch while it waited on Cloud TPU."""


@dataclasses.dataclass(frozen=True)
class Request:
  """What to ask Cloud TPU for.

  Attributes:
    name: the queued resource's name.
    nodes: the node (slice) names: (name,) for one slice, NAME-0 ...
      NAME-(N-1) for N, which the service names from a node prefix.
    accelerator_type: each slice's type, e.g. 'v4-32'.
    runtime_version: the TPU VM image.
    tier: 'spot', 'reserved' or 'on-demand'.
    valid_until: how long the request may wait for capacity: a duration
      ('6h', '1d') or an RFC 3339 time; '' for no limit.
  """
  name: str
  nodes: tuple[str, ...]
  accelerator_type: str
  runtime_version: str
  tier: str = 'on-demand'
  valid_until: str = ''

  def create_args(self) -> list[str]:
    """The arguments of `gcloud compute tpus queued-resources create`."""
    args = [
        self.name, f'--accelerator-type={self.accelerator_type}',
        f'--runtime-version={self.runtime_version}'
    ]
    if len(self.nodes) > 1:
      args += [f'--node-count={len(self.nodes)}', f'--node-prefix={self.name}']
    else:
      args.append(f'--node-id={self.nodes[0]}')
    if self.tier in ('spot', 'reserved'):
      args.append(f'--{self.tier}')
    if self.valid_until:
      kind = 'time' if re.match(r'^\d{4}-\d\d-\d\d',
                                self.valid_until) else ('duration')
      args.append(f'--valid-until-{kind}={self.valid_until}')
    return args


def node_names(tpu: str, num_slices: int) -> tuple[str, ...]:
  """The slices' node names: (tpu,) for one, tpu-0 ... for several, as a
  queued resource with --node-prefix=tpu names them."""
  if num_slices == 1:
    return (tpu,)
  return tuple(f'{tpu}-{i}' for i in range(num_slices))


@dataclasses.dataclass(frozen=True)
class Observation:
  """The queued resource's state and its nodes' (state, health) now.

  Attributes:
    queued: the queued resource's state (NOT_FOUND: there is none).
    nodes: {node: (state, health)}, empty while it has no nodes.
    detail: the service's message, for a FAILED one.
    of: the nodes the queued resource holds (its request's), named even
      where the service answered none: a lost slice's processes are known.
  """
  queued: str
  nodes: dict[str, tuple[str, str]]
  detail: str = ''
  of: tuple[str, ...] = ()

  def phase(self) -> str:
    """'capacity', 'provisioning', 'ready' (waiting for it), 'up' or
    'lost'."""
    if self.queued in WAITING:
      return 'capacity'
    if self.queued == 'PROVISIONING':
      return 'provisioning'
    if self.queued in LOST or self.queued == NOT_FOUND:
      return 'lost'
    states = [s for s, _ in self.nodes.values()]
    if any(s in NODE_LOST for s in states):
      return 'lost'
    if all(
        s == 'READY' and h in ('', 'HEALTHY') for s, h in self.nodes.values()):
      return 'up'
    return 'ready'

  def describe(self) -> str:
    """'queued resource FAILED: <the service's message>; node(s) ...'."""
    nodes = ', '.join(f'{n} {_node_state(self.queued, s)}' +
                      (f'/{h}' if h else '')
                      for n, (s, h) in self.nodes.items())
    return (f'queued resource {self.queued}' +
            (f': {self.detail}' if self.detail else '') +
            (f'; node(s) {nodes}' if nodes else ''))


def _node_state(queued: str, node: str) -> str:
  """A node's state as a person reads it: one that a FAILED or
  PROVISIONING queued resource never created is not 'NOT_FOUND'."""
  if node != NOT_FOUND:
    return node
  if queued == 'FAILED':
    return 'never created'
  if queued in WAITING or queued == 'PROVISIONING':
    return 'not created yet'
  return node


def _describe(command: list[str]) -> Optional[dict]:
  """The JSON of a describe, or None where the resource does not exist."""
  result = subprocess.run(command,
                          stdin=subprocess.DEVNULL,
                          capture_output=True,
                          text=True,
                          check=False)
  if result.returncode == 0:
    return json.loads(result.stdout)
  if 'NOT_FOUND' in result.stderr:
    return None
  raise LaunchError(
      f'`{shlex.join(command)}` failed: '
      f'{result.stderr.strip()[-500:]}',
      exit_code=exit_codes.POD_UNAVAILABLE)


def observe(gcloud: commands.Gcloud, request: Request) -> Observation:
  """Reads the queued resource and, once it has them, its nodes."""
  info = _describe(gcloud.queued('describe', request.name, '--format=json'))
  if info is None:
    return Observation(NOT_FOUND, {}, of=request.nodes)
  state = info.get('state', {})
  queued = state.get('state', 'STATE_UNSPECIFIED')
  detail = (state.get('failedData') or {}).get('error', {}).get('message', '')
  nodes = {}
  if queued not in WAITING:
    for node in request.nodes:
      described = _describe(gcloud.describe(node))
      nodes[node] = ((described.get('state', '?'),
                      described.get('health', '')) if described else
                     (NOT_FOUND, ''))
  return Observation(queued, nodes, detail, of=request.nodes)


@dataclasses.dataclass(frozen=True)
class Timeouts:
  """Seconds each phase may last (see the module docstring)."""
  capacity_s: float
  provisioning_s: float
  ready_s: float

  def of(self, phase: str) -> tuple[float, str]:
    return {
        'capacity': (self.capacity_s, '--capacity_timeout'),
        'provisioning': (self.provisioning_s, '--provisioning_timeout'),
        'ready': (self.ready_s, '--wait_healthy')
    }[phase]


class Fleet:
  """The queued resource of one launch: created, waited for, deleted.

  `ours` is True from the moment this launch asked for the queued resource
  until it is deleted: a Ctrl-C that lands while `create` runs still
  deletes it, and a queued resource that existed before is never touched.
  `up` is True from the moment every node was READY and HEALTHY until the
  slice is seen lost or is deleted.
  """

  def __init__(self, gcloud: commands.Gcloud, request: Request,
               timeouts: Timeouts, poll_s: float, log_path: str,
               say: Callable[[str], None], interrupted: Callable[[], bool]):
    self.gcloud = gcloud
    self.request = request
    self.timeouts = timeouts
    self.poll_s = poll_s
    self.log_path = log_path
    self.say = say
    self.interrupted = interrupted
    self.ours = False
    self.up = False

  def create(self) -> None:
    """Asks for the slice(s); returns once the request is accepted.

    Raises:
      LaunchError: when the queued resource already exists (it is not this
        launch's to manage) or the request is refused.
    """
    request = self.request
    existing = observe(self.gcloud, request)
    if existing.queued != NOT_FOUND:
      raise LaunchError(
          f'queued resource {request.name} already exists '
          f'({existing.describe()}); it is not this launch\'s to create or '
          'delete: launch without --create to use its slice, or delete it '
          f'with `gcloud compute tpus queued-resources delete {request.name}'
          f' --zone={self.gcloud.zone} --force`.')
    self.ours = True
    self.say(f'creating queued resource {request.name} '
             f'({request.accelerator_type} x {len(request.nodes)}, '
             f'{request.tier})')
    result = commands.run_logged(self.gcloud.queued('create',
                                                    *request.create_args()),
                                 self.log_path,
                                 own_session=True)
    if result.returncode:
      if observe(self.gcloud, request).queued == NOT_FOUND:
        self.ours = False
      raise LaunchError(
          f'creating queued resource {request.name} failed; '
          f'see {self.log_path}',
          exit_code=exit_codes.POD_UNAVAILABLE)

  def wait_up(self) -> Observation:
    """Follows the request until every node is READY and HEALTHY.

    Raises:
      Interrupted: on SIGINT or SIGTERM.
      LaunchError: POD_UNAVAILABLE when a phase outlasts its timeout or the
        slice is lost, naming the phase, the state and the time waited.
    """
    phase, since, last = '', time.monotonic(), ''
    failed_reads = 0
    while True:
      if self.interrupted():
        raise Interrupted()
      try:
        seen = observe(self.gcloud, self.request)
      except LaunchError as e:
        # One failed read (network, quota) is not a failed create.
        failed_reads += 1
        if failed_reads >= _READ_ATTEMPTS:
          raise
        self.say(f'could not read queued resource {self.request.name}: {e}')
        self._sleep(self.poll_s)
        continue
      failed_reads = 0
      now_phase = seen.phase()
      if seen.describe() != last:
        last = seen.describe()
        self.say(f'{self.request.name}: {last}')
      if now_phase == 'up':
        self.up = True
        return seen
      if now_phase == 'lost' and seen.queued == 'FAILED':
        raise LaunchError(
            f'queued resource {self.request.name} FAILED, the service says: '
            f'{seen.detail or "(no message)"}. Try another zone, '
            'accelerator type or --spot/--reserved.',
            exit_code=exit_codes.POD_UNAVAILABLE)
      if now_phase == 'lost':
        raise LaunchError(
            f'queued resource {self.request.name} is lost '
            f'while waiting for it: {last}',
            exit_code=exit_codes.POD_UNAVAILABLE)
      if now_phase != phase:
        phase, since = now_phase, time.monotonic()
      limit, flag = self.timeouts.of(phase)
      waited = time.monotonic() - since
      if waited > limit:
        raise LaunchError(
            f'queued resource {self.request.name}: the {phase} phase took '
            f'over {limit:g} s ({flag}); still {last}. Raise {flag}, or pick '
            'another zone or accelerator type.',
            exit_code=exit_codes.POD_UNAVAILABLE)
      self._sleep(self.poll_s)

  def _sleep(self, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not self.interrupted():
      time.sleep(0.05)

  def delete(self, why: str) -> None:
    """Deletes the queued resource and its nodes, if this launch made them;
    returns once they are gone."""
    if not self.ours:
      return
    self.say(f'{why}: deleting queued resource {self.request.name} and its '
             'node(s)')
    result = commands.run_logged(self.gcloud.queued('delete', self.request.name,
                                                    '--force', '--quiet'),
                                 self.log_path,
                                 own_session=True)
    left = observe(self.gcloud, self.request)
    if result.returncode and left.queued != NOT_FOUND:
      raise LaunchError(
          f'could not delete queued resource {self.request.name} '
          f'({left.describe()}); see {self.log_path}. Delete it by hand: '
          f'`gcloud compute tpus queued-resources delete {self.request.name}'
          f' --zone={self.gcloud.zone} --force`.',
          exit_code=exit_codes.POD_UNAVAILABLE)
    self.ours = self.up = False
    self.say(f'queued resource {self.request.name} deleted')

  def lost(self) -> Optional[Observation]:
    """The observation, when the slice is gone (preempted, suspended,
    failed, deleted); None while it is up or still coming."""
    seen = observe(self.gcloud, self.request)
    if seen.phase() != 'lost':
      return None
    self.up = False
    return seen
