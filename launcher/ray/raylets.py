"""Whether a Ray node's raylet is gone, asked of the raylet itself.

Ray declares a node dead only once its health checks have failed (about
12 s on a local cluster here); until then its actors just answer nothing,
as a merely busy node's may. A raylet that is gone refuses a connection to
its node manager's port at once (its machine still up) or lets it time out
(its machine gone), while a live one, however loaded, completes the
handshake in its kernel. The driver asks this only of a node whose actor
has already gone silent.

Example:
  >>> places = raylets.addresses(group.nodes)
  >>> raylets.gone(places.get(node_id))
  False
"""

import socket
from typing import Iterable, Optional

# A live raylet's kernel answers a connection within a round trip.
_CONNECT_TIMEOUT_S = 0.5


def addresses(node_ids: Iterable[str]) -> dict[str, tuple[str, int]]:
  """{node id: (address, node manager port)} of those nodes Ray lists."""
  # Imported here: Ray reads its environment once, when it is imported
  # (tests/ray_cluster.py), so a module that only names this one (the unit
  # tests) must not import it first.
  import ray  # pylint: disable=g-import-not-at-top
  wanted = set(node_ids)
  return {
      n['NodeID']: (n['NodeManagerAddress'], int(n['NodeManagerPort']))
      for n in ray.nodes()
      if n.get('NodeID') in wanted
  }


def gone(address: Optional[tuple[str, int]],
         timeout_s: float = _CONNECT_TIMEOUT_S) -> bool:
  """Whether the raylet at (host, port) refuses a connection or lets it
  time out; False for an unknown address (None)."""
  if address is None:
    return False
  try:
    with socket.create_connection(address, timeout=timeout_s):
      return False
  except OSError:  # Refused, unreachable, or timed out.
    return True
