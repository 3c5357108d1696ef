"""The job's nodes on a Ray cluster: one bundle per process in a
STRICT_SPREAD placement group, and on each a `Host` actor (host.py).

Each attempt gets a placement group and actors of its own, and removes
them at its end, so nothing of it outlives it on any node.

Example:
  >>> group = Group.reserve(4, {'GPU': 8}, timeout_s=120)
  >>> group.start(['--config=configs/mnist.py', '--workdir=/shared/mnist'],
  ...             job_id='3f2a', attempt='3f2a-a1')
  >>> group.read()          # [(rank, stream, line), ...], {rank: exit code}
  >>> group.remove()
"""

import signal
from typing import Any

import ray
from ray.util.placement_group import placement_group
from ray.util.placement_group import remove_placement_group
from ray.util import scheduling_strategies

from launcher.ray import host as host_lib
from runtime.common import env_vars
from runtime.common import exit_codes


# The exit code of a process whose node died under it: what SIGKILL gives,
# as a host that vanished does everywhere (launcher/local/elastic.py).
LOST = exit_codes.SIGNAL_BASE + signal.SIGKILL


class CapacityError(exit_codes.PodrunError):
  """The cluster cannot hold the job's bundles."""
  exit_code = exit_codes.POD_UNAVAILABLE


def actor_options(resources: dict[str, float]) -> dict[str, Any]:
  """Ray's actor options for a bundle: CPU and GPU by their own names (so
  that Ray sets the visible devices), everything else as resources."""
  others = {k: v for k, v in resources.items() if k not in ('CPU', 'GPU')}
  return {'num_cpus': resources.get('CPU', 0),
          'num_gpus': resources.get('GPU', 0),
          **({'resources': others} if others else {})}


def _what_fits(resources: dict[str, float]) -> str:
  """How many of the cluster's live nodes hold one bundle each, for the
  message when the group cannot be placed."""
  fitting = [n for n in ray.nodes() if n.get('Alive') and all(
      n.get('Resources', {}).get(k, 0) >= v for k, v in resources.items())]
  return f'{len(fitting)} of the {len(ray.nodes())} node(s) hold one'


class Group:
  """The processes of one attempt, one per node."""

  def __init__(self, placement, hosts: list[Any]):
    self.placement = placement
    self.hosts = hosts
    self.ended: dict[int, int] = {}
    self.lost: dict[int, str] = {}
    self.nodes: list[str] = []

  @classmethod
  def reserve(cls, num_processes: int, resources: dict[str, float],
              timeout_s: float) -> 'Group':
    """Places one bundle of `resources` on each of `num_processes` nodes.

    Raises:
      CapacityError: when Ray cannot place them within `timeout_s`, naming
        how many nodes could hold a bundle.
    """
    placement = placement_group(
        [dict(resources)] * num_processes, strategy='STRICT_SPREAD')
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
    hosts = [actor.options(
        **actor_options(resources),
        scheduling_strategy=scheduling_strategies
        .PlacementGroupSchedulingStrategy(
            placement, placement_group_bundle_index=i)).remote()
             for i in range(num_processes)]
    return cls(placement, hosts)

  def start(self, launcher_args: list[str], job_id: str, attempt: str
            ) -> tuple[str, list[int]]:
    """Starts every process, process 0's node the coordinator; returns the
    coordinator's address and each process's pid on its node."""
    places = ray.get([host.address.remote() for host in self.hosts])
    self.nodes = [node for _, _, node in places]
    ip, port, _ = places[0]
    coordinator = f'[{ip}]:{port}' if ':' in ip else f'{ip}:{port}'
    pids = ray.get([host.start.remote(launcher_args, {
        env_vars.COORDINATOR_ADDRESS: coordinator,
        env_vars.COORDINATOR_BIND_ADDRESS: coordinator,
        env_vars.NUM_PROCESSES: str(len(self.hosts)),
        env_vars.PROCESS_ID: str(rank),
        env_vars.JOB_ID: job_id,
        env_vars.ATTEMPT: attempt}) for rank, host in enumerate(self.hosts)])
    return coordinator, pids

  def read(self) -> list[tuple[int, str, str]]:
    """What every running process said since the last read, as
    (rank, stream, line); notes each one's exit code in `ended`, and in
    `lost` the ranks whose actor died with its node (exit code LOST)."""
    running = [r for r in range(len(self.hosts)) if r not in self.ended]
    replies = {r: self.hosts[r].read.remote() for r in running}
    out = []
    for rank, reply in replies.items():
      try:
        lines, code = ray.get(reply)
      except ray.exceptions.ActorUnavailableError:
        continue  # Reachable again soon, or dead at the next read.
      except ray.exceptions.RayActorError as e:
        self.lost[rank] = str(e).strip().splitlines()[0]
        self.ended[rank] = LOST
        continue
      out += [(rank, stream, line) for stream, line in lines]
      if code is not None:
        self.ended[rank] = code
    return out

  def draining(self) -> dict[int, int]:
    """{rank: the drain's deadline in ms since the epoch, 0 for none} of
    every running process whose node Ray is draining (`ray drain-node`, the
    autoscaler's or a preemption's drain; what Ray Train polls too)."""
    from ray._private import state  # pylint: disable=g-import-not-at-top
    nodes = state.state.get_draining_nodes()
    return {r: nodes[node] for r, node in enumerate(self.nodes)
            if node in nodes and r not in self.ended}

  def signal(self, signum: int) -> None:
    """Sends `signum` to every process still running (SIGTERM: the
    preemption notice, after which each saves the step they agree on)."""
    refs = [self.hosts[r].signal.remote(signum)
            for r in range(len(self.hosts)) if r not in self.ended]
    self._quietly(refs)

  def stop(self, grace_s: float) -> None:
    """Stops every process still running (SIGTERM, SIGKILL after
    `grace_s`); a node that dies meanwhile has stopped it too."""
    self._quietly([self.hosts[r].stop.remote(grace_s)
                   for r in range(len(self.hosts)) if r not in self.ended])

  @staticmethod
  def _quietly(refs: list[Any]) -> None:
    """Waits for each call; a node that died meanwhile is no error."""
    for ref in refs:
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
