"""The job's nodes on a Ray cluster: one bundle per process in a
STRICT_SPREAD placement group, and on each a `Host` actor (host.py).

Each attempt gets a placement group and actors of its own, and removes
them at its end, so nothing of it outlives it on any node.

Example:
  >>> group = Group.reserve(4, {'GPU': 8}, timeout_s=120)
  >>> group.start(['--config=configs/mnist.py', '--workdir=/shared/mnist'],
  ...             handoff.Handoff(job_id='3f2a', attempt='3f2a-a1'))
  >>> group.read()          # [(process index, stream, line), ...]
  >>> group.remove()
"""

import dataclasses
import signal
import time
from typing import Any, Optional, Sequence

import ray
from ray.util.placement_group import placement_group
from ray.util.placement_group import remove_placement_group
from ray.util import scheduling_strategies

from launcher.ray import host as host_lib
from launcher.ray import raylets
from runtime.common import exit_codes
from runtime.common import handoff

# The exit code of a process whose node died under it: what SIGKILL gives,
# as a host that vanished does everywhere (launcher/local/elastic.py).
LOST = exit_codes.SIGNAL_BASE + signal.SIGKILL
# How long an actor's answer may take before its rank counts as silent.
# Ray declares a node dead only after its health checks fail (about 12 s
# here, as measured); an actor whose node died answers nothing meanwhile.
SILENT_AFTER_S = 1.0
# How long a call that changes a process (signal, stop, gone) is waited
# for, beyond its own grace, before its node is left to Ray.
_CALL_TIMEOUT_S = 5.0


class CapacityError(exit_codes.PodrunError):
  """The cluster cannot hold the job's bundles."""
  exit_code = exit_codes.POD_UNAVAILABLE


def actor_options(resources: dict[str, float]) -> dict[str, Any]:
  """Ray's actor options for a bundle: CPU and GPU by their own names (so
  that Ray sets the visible devices), everything else as resources."""
  others = {k: v for k, v in resources.items() if k not in ('CPU', 'GPU')}
  return {
      'num_cpus': resources.get('CPU', 0),
      'num_gpus': resources.get('GPU', 0),
      **({
          'resources': others
      } if others else {})
  }


def _what_fits(resources: dict[str, float]) -> str:
  """How many of the cluster's live nodes hold one bundle each, for the
  message when the group cannot be placed."""
  fitting = [
      n for n in ray.nodes() if n.get('Alive') and all(
          n.get('Resources', {}).get(k, 0) >= v for k, v in resources.items())
  ]
  return f'{len(fitting)} of the {len(ray.nodes())} node(s) hold one'


class Group:
  """The processes of one attempt, one per node.

  Attributes:
    hosts: the actors, one a process.
    nodes: Ray's id of each process's node.
    ended: {process index: exit code} of every process known to have ended.
    lost: {process index: what Ray said} of processes whose node died.
    silent: {process index: monotonic time since when} of running processes
      whose actor has not answered a read for SILENT_AFTER_S (a node gone
      that Ray has not declared dead yet, or one very busy).
  """

  def __init__(self, placement, hosts: list[Any]):
    self.placement = placement
    self.hosts = hosts
    self.ended: dict[int, int] = {}
    self.lost: dict[int, str] = {}
    self.silent: dict[int, float] = {}
    self.nodes: list[str] = []
    self._raylets: dict[str, tuple[str, int]] = {}  # node: its raylet
    self._reads: dict[int, Any] = {}  # rank: its pending read
    self._heard: dict[int, float] = {}  # rank: when its actor last answered

  @classmethod
  def reserve(cls, num_processes: int, resources: dict[str, float],
              timeout_s: float) -> 'Group':
    """Places one bundle of `resources` on each of `num_processes` nodes.

    Raises:
      CapacityError: when Ray cannot place them within `timeout_s`, naming
        how many nodes could hold a bundle.
    """
    placement = placement_group([dict(resources)] * num_processes,
                                strategy='STRICT_SPREAD')
    ready, _ = ray.wait([placement.ready()], timeout=timeout_s)
    if not ready:
      fits = _what_fits(resources)
      remove_placement_group(placement)
      raise CapacityError(
          f'--num_processes={num_processes} needs {num_processes} nodes with '
          f'--resources_per_process={resources} each, one process a node; '
          f'{fits}, and none came within {timeout_s:g} s. Lower '
          '--num_processes, or add nodes.')
    actor = ray.remote(host_lib.Host)
    hosts = [
        actor.options(**actor_options(resources),
                      scheduling_strategy=scheduling_strategies.
                      PlacementGroupSchedulingStrategy(
                          placement, placement_group_bundle_index=i)).remote()
        for i in range(num_processes)
    ]
    return cls(placement, hosts)

  def start(self,
            launcher_args: Sequence[str],
            told: handoff.Handoff,
            env: Optional[dict[str, str]] = None) -> tuple[str, list[int]]:
    """Starts every process, process 0's node the coordinator, told
    `told` and its place, with the user's `env`; returns the coordinator's
    address and each process's pid on its node."""
    places = ray.get([host.address.remote() for host in self.hosts])
    self.nodes = [node for _, _, node in places]
    self._raylets = raylets.addresses(self.nodes)
    ip, port, _ = places[0]
    coordinator = f'[{ip}]:{port}' if ':' in ip else f'{ip}:{port}'
    pids = ray.get([
        host.start.remote(
            list(launcher_args),
            dataclasses.replace(told,
                                coordinator_address=coordinator,
                                coordinator_bind_address=coordinator,
                                num_processes=len(self.hosts),
                                process_id=process_index), env or {})
        for process_index, host in enumerate(self.hosts)
    ])
    return coordinator, pids

  def read(self, wait_s: float = 0.2) -> list[tuple[int, str, str]]:
    """What every running process said since the last read, as
    (process index, stream, line), waiting at most `wait_s`; notes each
    one's exit code in `ended`, in `lost` the processes whose actor died
    with its node (exit code LOST), and in `silent` those whose actor has
    not answered for SILENT_AFTER_S."""
    now = time.monotonic()
    for process_index in self._running():
      self._heard.setdefault(process_index, now)
      if process_index not in self._reads:
        self._reads[process_index] = self.hosts[process_index].read.remote()
    refs = {ref: process_index for process_index, ref in self._reads.items()}
    done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=wait_s)
    out = []
    for ref in done:
      process_index = refs[ref]
      del self._reads[process_index]
      try:
        lines, code = ray.get(ref)
      except ray.exceptions.ActorUnavailableError:
        continue  # Reachable again soon, or dead at the next read.
      except ray.exceptions.RayActorError as e:
        self.lost[process_index] = str(e).strip().splitlines()[0]
        self.ended[process_index] = LOST
        self.silent.pop(process_index, None)
        continue
      self._heard[process_index] = time.monotonic()
      self.silent.pop(process_index, None)
      out += [(process_index, stream, line) for stream, line in lines]
      if code is not None:
        self.ended[process_index] = code
    now = time.monotonic()
    for process_index in self._running():
      if now - self._heard[process_index] > SILENT_AFTER_S:
        self.silent[process_index] = self._heard[process_index]
    return out

  def take_lost(self, process_index: int, why: str) -> None:
    """Counts silent `rank` as lost with its node (exit code LOST) before
    Ray declares it dead: every other process has ended."""
    self.lost[process_index] = why
    self.ended[process_index] = LOST
    self.silent.pop(process_index, None)
    self._reads.pop(process_index, None)

  def last_heard(self, process_index: int) -> float:
    """When `rank`'s actor last answered (monotonic): a lost node's process
    ended about then, before the consequences seen in the others."""
    return self._heard.get(process_index, time.monotonic())

  def raylet_gone(self, process_index: int) -> bool:
    """Whether the raylet of the process's node takes no connection."""
    return raylets.gone(self._raylets.get(self.nodes[process_index]))

  def tell_gone(self,
                processes: list[int],
                why: str,
                dead: tuple[int, ...] = ()) -> None:
    """Tells every other running process that the hosts of `processes` went
    (launcher/process/peers.py, Gone): their supervisors take those processes
    for lost after a few seconds without a heartbeat, not after
    --heartbeat_timeout, and those of `dead` (their raylets gone) after
    two beats missed (peers.DEAD_SILENCE_S); one that still beats stays in
    the job."""
    self._quietly([
        self.hosts[i].gone.remote(processes, why, tuple(dead))
        for i in self._running()
        if i not in processes
    ], _CALL_TIMEOUT_S)

  def spare_nodes(self, resources: dict[str, float]) -> int:
    """How many live nodes outside the group, not draining, have a bundle
    of `resources` free now: the nodes the job could grow onto."""
    from ray._private import state  # pylint: disable=g-import-not-at-top
    draining = state.state.get_draining_nodes()
    free = state.available_resources_per_node()
    return sum(1 for node, available in free.items()
               if node not in self.nodes and node not in draining and all(
                   available.get(k, 0) >= v for k, v in resources.items()))

  def draining(self) -> dict[int, int]:
    """{process index: the drain's deadline in ms since the epoch, 0 for
    none} of every running process whose node Ray is draining (`ray
    drain-node`, the autoscaler's or a preemption's drain; what Ray Train
    polls too)."""
    from ray._private import state  # pylint: disable=g-import-not-at-top
    nodes = state.state.get_draining_nodes()
    return {
        r: nodes[node]
        for r, node in enumerate(self.nodes)
        if node in nodes and r not in self.ended
    }

  def signal(self, signum: int) -> None:
    """Sends `signum` to every process still running (SIGTERM: the
    preemption notice, after which each saves the step they agree on)."""
    self._quietly(
        [self.hosts[r].signal.remote(signum) for r in self._running()],
        _CALL_TIMEOUT_S)

  def stop(self, grace_s: float) -> None:
    """Stops every process still running (SIGTERM, SIGKILL after
    `grace_s`); a node that dies meanwhile has stopped it too."""
    self._quietly([self.hosts[r].stop.remote(grace_s) for r in self._running()],
                  grace_s + _CALL_TIMEOUT_S)

  def _running(self) -> list[int]:
    """The ranks not known to have ended, silent ones included."""
    return [r for r in range(len(self.hosts)) if r not in self.ended]

  @staticmethod
  def _quietly(refs: list[Any], timeout_s: float) -> None:
    """Waits up to `timeout_s` for the calls; a node that died meanwhile
    (its call fails, or never answers) is no error: Ray's death notice or
    `take_lost` ends its rank."""
    if not refs:
      return
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for ref in done:
      try:
        ray.get(ref)
      except ray.exceptions.RayActorError:
        pass

  def remove(self) -> None:
    """Kills the actors (their processes die with them) and frees the
    bundles."""
    for host in self.hosts:
      ray.kill(host)
    remove_placement_group(self.placement)
