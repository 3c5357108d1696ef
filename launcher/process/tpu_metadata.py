"""What a TPU VM's metadata server says of the slice, asked once, bounded.

JAX asks the metadata server whenever libtpu is installed and no cluster
variable answers first, and it neither catches a connection error nor bounds
a silent route well (up to 60 s a try, six tries). A TPU host with no server
in reach (a container without the host's network, a hosted notebook's TPU,
a machine lent without Google's network) is a single host, so the launcher
asks first, here, within `BOUND_S`, and lets JAX ask only where the server
names more than one worker.
"""

import dataclasses
import os
import threading
import urllib.error
import urllib.request
from typing import Mapping, Optional

# JAX reads the server's address from this variable too (cloud_tpu_cluster).
ADDRESS_VAR = 'GCE_METADATA_IP'
DEFAULT_ADDRESS = 'metadata.google.internal'
# A metadata server answers in milliseconds; a host without one should not
# wait long to learn it runs alone.
BOUND_S = 2.0
_WORKERS_KEY = 'worker-network-endpoints'


@dataclasses.dataclass(frozen=True)
class Answer:
  """The workers the metadata server names, or why it named none.

  Attributes:
    address: the server asked, HOST[:PORT].
    workers: the slice's worker endpoints, in worker order; None when the
      server did not answer with them.
    failure: why there are no workers ('' when there are).
  """
  address: str
  workers: Optional[tuple[str, ...]]
  failure: str = ''


def address(env: Optional[Mapping[str, str]] = None) -> str:
  """The metadata server's HOST[:PORT], as JAX finds it."""
  env = os.environ if env is None else env
  return env.get(ADDRESS_VAR) or DEFAULT_ADDRESS


def _get(url: str, timeout_s: float) -> tuple[int, str]:
  request = urllib.request.Request(url, headers={'Metadata-Flavor': 'Google'})
  # A proxy would answer for a server it cannot reach; the server is local.
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
  try:
    with opener.open(request, timeout=timeout_s) as response:
      return response.status, response.read().decode('utf-8', 'replace')
  except urllib.error.HTTPError as e:
    return e.code, ''


def workers(env: Optional[Mapping[str, str]] = None,
            bound_s: float = BOUND_S) -> Answer:
  """Asks the metadata server for the slice's workers, within `bound_s`.

  The whole question, the name's lookup included (which a socket timeout
  does not bound), is asked on a daemon thread that is left behind if it
  does not answer in time.

  Returns:
    An Answer: workers from `worker-network-endpoints` (comma-separated
    hostnames, or NAME:ID:IP triples of which the IP is kept), or the
    failure: the error, the HTTP status, or that nothing answered in time.
  """
  where = address(env)
  url = (f'http://{where}/computeMetadata/v1/instance/attributes/'
         f'{_WORKERS_KEY}')
  result: list = []

  def ask():
    try:
      # The join below decides silence; the socket's own timeout, later,
      # only ends the thread.
      result.append(_get(url, bound_s + 1))
    except Exception as e:  # pylint: disable=broad-except
      result.append(e)

  thread = threading.Thread(target=ask, name='tpu-metadata', daemon=True)
  thread.start()
  thread.join(bound_s)
  silent = Answer(where, None, f'no answer from {where} within {bound_s:g} s')
  if not result:
    return silent
  if isinstance(result[0], Exception):
    error = result[0]
    reason = getattr(error, 'reason', error)
    if isinstance(reason, TimeoutError):  # socket.timeout is TimeoutError.
      return silent
    return Answer(
        where, None, f'{where} cannot be reached ({type(reason).__name__}: '
        f'{reason})')
  status, body = result[0]
  if status != 200:
    return Answer(where, None, f'{where} answered HTTP {status} for '
                  f'{_WORKERS_KEY}')
  endpoints = tuple(_host(w) for w in body.strip().split(',') if w.strip())
  if not endpoints:
    return Answer(where, None, f'{where} names no workers')
  return Answer(where, endpoints)


def _host(endpoint: str) -> str:
  parts = endpoint.strip().split(':')
  return parts[2] if len(parts) == 3 else parts[0]
