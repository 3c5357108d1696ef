"""A real Ray cluster on this machine (ray.cluster_utils.Cluster): several
raylets on 127.0.0.1, each a node with one {"host": 1} resource, so that a
placement group's STRICT_SPREAD puts one process on each.

Ray takes 127.0.0.1 for "this machine" and swaps in the machine's address
unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps everything on loopback
(ray/_private/services.py, get_node_ip_address), which Ray reads once, when
it is imported: so this module sets it in the test process before anything
imports Ray, and every podrun-ray a test starts gets it too (`ENV`).

Example:
  >>> with RayCluster(nodes=4) as cluster:
  ...   result = run_podrun_ray(cluster.address, 4, [...])
"""

import os
import subprocess
import sys
import time
from typing import Optional

from tests import helpers

ENV = {'RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER': '0'}
os.environ.update(ENV)
NODE = {'num_cpus': 1, 'resources': {'host': 1}, 'node_ip_address': '127.0.0.1'}


class RayCluster:
  """`nodes` raylets on 127.0.0.1; the test process connected to them."""

  def __init__(self, nodes: int):
    self.nodes = nodes
    self.cluster = None
    self.address: Optional[str] = None

  def __enter__(self) -> 'RayCluster':
    import ray  # pylint: disable=g-import-not-at-top
    from ray import cluster_utils  # pylint: disable=g-import-not-at-top
    # Each node unpacks a job's working_dir in a directory of its own, as
    # machines of their own do: in one session directory, a node's unpack
    # (it overwrites) would pull the directory from under another's process.
    self.cluster = cluster_utils.Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={
            **NODE, 'include_dashboard': False,
            'runtime_env_dir_name': 'runtime_resources_0'
        })
    for i in range(1, self.nodes):
      self.cluster.add_node(**NODE,
                            runtime_env_dir_name=f'runtime_resources_{i}')
    self.cluster.wait_for_nodes()
    self.address = self.cluster.address
    ray.init(address=self.address, logging_level='warning', log_to_driver=False)
    return self

  def remove_node_of(self, node_id: str) -> None:
    """Kills the raylet of node `node_id` and everything on it, as a
    machine that vanishes (not the head's)."""
    node, = [n for n in self.cluster.list_all_nodes() if n.node_id == node_id]
    assert node is not self.cluster.head_node, 'the head holds the cluster'
    self.cluster.remove_node(node, allow_graceful=False)

  def drain(self, node_id: str, deadline_s: int) -> None:
    """`ray drain-node` as a preemption does it: the node stays up, Ray
    schedules nothing more on it, and says when it goes."""
    subprocess.run([
        os.path.join(os.path.dirname(sys.executable),
                     'ray'), 'drain-node', f'--address={self.address}',
        f'--node-id={node_id}', '--reason=DRAIN_NODE_REASON_PREEMPTION',
        '--reason-message=a test preempts it',
        f'--deadline-remaining-seconds={deadline_s}'
    ],
                   env=helpers.launcher_env(**ENV),
                   check=True,
                   timeout=60,
                   capture_output=True)

  def rank_off_the_head(self, workdir) -> tuple[int, str]:
    """(the highest rank whose node is not the head's, that node's id) of
    the running attempt (WORKDIR/logs/job.json): a node a test may kill or
    drain without taking the cluster with it."""
    nodes = [
        r['node'] for r in helpers.read_json(
            os.path.join(workdir, 'logs', 'job.json'))['ranks']
    ]
    head = self.cluster.head_node.node_id
    rank = max(r for r, node in enumerate(nodes) if node != head)
    return rank, nodes[rank]

  def live_placement_groups(self) -> list[str]:
    """The ids of placement groups not removed: a job's, while it runs."""
    from ray.util import placement_group_table  # pylint: disable=g-import-not-at-top
    return [
        group_id for group_id, group in placement_group_table().items()
        if group['state'] != 'REMOVED'
    ]

  def free_hosts(self) -> float:
    """How many {"host": 1} are not held by any placement group or actor."""
    import ray  # pylint: disable=g-import-not-at-top
    return ray.available_resources().get('host', 0.0)

  def __exit__(self, *exc) -> None:
    import ray  # pylint: disable=g-import-not-at-top
    ray.shutdown()
    self.cluster.shutdown()


def start_podrun_ray(address: str,
                     num_processes: int,
                     launcher_args: list[str],
                     *own: str,
                     cwd=helpers.REPO) -> subprocess.Popen:
  """Starts `podrun-ray` from `cwd` (the project that travels) with one
  {"host": 1} a process, in a session of its own; stdout and stderr as text
  pipes."""
  return subprocess.Popen([
      sys.executable, '-m', 'launcher.ray', f'--address={address}',
      f'--num_processes={num_processes}', '--resources_per_process={"host": 1}',
      *own, '--', *launcher_args
  ],
                          cwd=cwd,
                          env=helpers.launcher_env(**ENV),
                          stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          text=True,
                          start_new_session=True)


def read_until(stream, text: str, seen: Optional[list[str]] = None) -> None:
  """Reads `stream` up to the first line that holds `text`; the lines read
  go to `seen` (helpers.finish then has only the rest)."""
  for line in stream:
    if seen is not None:
      seen.append(line)
    if text in line:
      return


def run_podrun_ray(address: str,
                   num_processes: int,
                   launcher_args: list[str],
                   *own: str,
                   timeout: float = 180,
                   cwd=helpers.REPO) -> helpers.Result:
  """Runs `podrun-ray` from `cwd` to its end."""
  started = time.monotonic()
  return helpers.finish(
      start_podrun_ray(address, num_processes, launcher_args, *own, cwd=cwd),
      timeout, started)
