"""Starting JAX's distributed system in this process, or deciding not to.

`plan` decides how from the flags and the environment; `initialize` checks
what JAX itself would only report by crashing (a coordinator port in use makes
the coordinator segfault, an unreachable coordinator aborts the process after
the timeout) and then calls `jax.distributed.initialize`.
"""

import dataclasses
import errno
import itertools
import ipaddress
import os
import socket
import time
from typing import Any, Callable, Mapping, MutableMapping, Optional

from absl import logging

from launcher.process import credentials
from launcher.process import roll_call
from launcher.process import tpu_metadata
from launcher.common import cluster
from runtime.common import exit_codes
from runtime.common import handoff
from launcher.common import job_tls
from launcher.common import process_flags

EXPLICIT = 'explicit'  # All of coordinator, count and id given.
DETECT = 'detect'  # None given, on a cluster JAX configures itself.
SINGLE = 'single'  # None given, no cluster: one process, no coordinator.

# JAX's own heartbeat timeout exceeds --heartbeat_timeout by this much, so
# that the supervisor, which names the lost process and exits with
# exit_codes.PEER_FAILED, acts first.
JAX_HEARTBEAT_MARGIN_S = 30


class DistributedInitError(exit_codes.PodrunError, RuntimeError):
  """jax.distributed could not start; the message says why and what to do."""
  exit_code = exit_codes.DISTRIBUTED_INIT_FAILED


# The distributed flags, declared with the flags they are.
CoordinatorFlags = process_flags.CoordinatorFlags


@dataclasses.dataclass(frozen=True)
class Plan:
  """How this process joins the job, and why (one line for the log).

  Attributes:
    mode: EXPLICIT, DETECT or SINGLE.
    why: what decided it, e.g. 'SLURM's variables' or 'libtpu is installed
      but metadata.google.internal cannot be reached (...)'.
    environment: (variable, value) pairs to set before JAX's backend starts.
  """
  mode: str
  why: str
  environment: tuple[tuple[str, str], ...] = ()


def split_address(address: str,
                  flag: str = '--coordinator_address') -> tuple[str, int]:
  """'host:port' or '[v6]:port' -> (host, port)."""
  host, sep, port = address.rpartition(':')
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise DistributedInitError(
        f'{flag}={address!r} is not HOST:PORT (for example 10.0.0.2:8476)')
  return host.strip('[]'), int(port)


def plan(
    options: CoordinatorFlags,
    env: Optional[Mapping[str, str]] = None,
    ask: Callable[[Mapping[str, str]],
                  tpu_metadata.Answer] = (tpu_metadata.workers)
) -> Plan:
  """Chooses how this process joins the job: EXPLICIT, DETECT or SINGLE.

  Args:
    options: the launcher's flags.
    env: the environment; os.environ by default.
    ask: asks a TPU VM's metadata server for the slice's workers (bounded).

  Raises:
    DistributedInitError: when only some of the three flags are given, or
      they contradict each other or --cluster=none.
  """
  env = os.environ if env is None else env
  given = {
      '--coordinator_address': options.coordinator_address,
      '--num_processes': options.num_processes,
      '--process_id': options.process_id,
  }
  missing = [k for k, v in given.items() if v is None]
  if len(missing) == 3:
    if options.cluster == cluster.NONE:
      return Plan(SINGLE, '--cluster=none')
    return _found(env, ask)
  present = ', '.join(f'{k}={v}' for k, v in given.items() if v is not None)
  if options.cluster == cluster.NONE:
    raise DistributedInitError(
        f'--cluster=none runs one process alone, but {present} ask for a job '
        'of several: drop one or the other.')
  if missing == ['--coordinator_address'
                ] and cluster.detect(env) == 'open_mpi_5':
    raise DistributedInitError(
        f'Open MPI 5 gives {present} (OMPI_COMM_WORLD_RANK and _SIZE) but no '
        'coordinator: it runs on PRRTE, without the ORTE variables JAX '
        'detects Open MPI by. Pass --coordinator_address=HOST:PORT, HOST '
        f'being the node of rank 0 (or set '
        f'{handoff.variable("coordinator_address")} in mpirun -x).')
  if missing:
    raise DistributedInitError(
        f'{present} given without {" and ".join(missing)}: pass all three, or '
        'none of them on a cluster JAX detects (Cloud TPU, SLURM, Open MPI, '
        'Kubernetes) or on a single machine.')
  address, count, index = (options.coordinator_address, options.num_processes,
                           options.process_id)
  assert address is not None and count is not None and index is not None
  split_address(address)
  if count < 1:
    raise DistributedInitError(
        f'--num_processes={count}; it must be at least 1')
  if not 0 <= index < count:
    raise DistributedInitError(
        f'--process_id={index} is outside [0, {count}) for '
        f'--num_processes={count}')
  return Plan(EXPLICIT, '--coordinator_address, --num_processes and '
              '--process_id')


_DETECTED_BY = {
    'slurm': "SLURM's variables (inside srun)",
    'open_mpi': "Open MPI's variables (under mpirun)",
    'kubernetes': "a Kubernetes indexed Job's variables",
}


def _found(env: Mapping[str, str], ask: Callable[[Mapping[str, str]],
                                                 tpu_metadata.Answer]) -> Plan:
  """DETECT where the environment names a cluster of several processes,
  else SINGLE; `why` says which variables or which answer decided."""
  name = cluster.detect(env)
  if name is None:
    return Plan(
        SINGLE, 'no cluster in the environment (no SLURM, Open MPI, '
        'Kubernetes or TPU variables, no libtpu)')
  if name in _DETECTED_BY:
    return Plan(DETECT, _DETECTED_BY[name])
  if env.get('MEGASCALE_COORDINATOR_ADDRESS'):
    return Plan(DETECT, 'MEGASCALE_COORDINATOR_ADDRESS (several TPU slices)')
  if name == 'gke_tpu':
    hosts = [h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h]
    if len(hosts) == 1:
      return Plan(SINGLE, f'TPU_WORKER_HOSTNAMES names one worker '
                  f'({hosts[0]})')
    return Plan(
        DETECT,
        'GKE\'s TPU variables' + (f' ({len(hosts)} workers)' if hosts else ''))
  # libtpu is installed: a Cloud TPU VM's metadata server, if there is one,
  # says how many workers the slice has.
  if env.get('TPU_SKIP_MDS_QUERY') is not None:
    # JAX sets it on import where it finds no TPU chip.
    return Plan(
        SINGLE, 'libtpu is installed and TPU_SKIP_MDS_QUERY is set '
        '(no metadata server to ask)')
  answer = ask(env)
  if answer.workers is None:
    # libtpu asks the same server when its backend starts, and waits for
    # minutes where none answers (seen on a TPU v5e in a container).
    return Plan(SINGLE, f'libtpu is installed but {answer.failure}',
                (('TPU_SKIP_MDS_QUERY', '1'),))
  if len(answer.workers) == 1:
    return Plan(
        SINGLE, f'the TPU metadata server at {answer.address} names '
        'one worker')
  return Plan(
      DETECT, f'the TPU metadata server at {answer.address} names '
      f'{len(answer.workers)} workers')


# How long process 0 waits for its coordinator's port to be let go: an
# earlier attempt's coordinator on this machine may still be exiting.
PORT_WAIT_S = 20.0


def _bind_once(host: str, port: int) -> None:
  family = socket.AF_INET6 if ':' in host else socket.AF_INET
  with socket.socket(family, socket.SOCK_STREAM) as s:
    # As gRPC does: reuse a port in TIME_WAIT, but not one with a listener.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))


def _check_port_free(bind_address: str, wait_s: float = PORT_WAIT_S) -> None:
  """Raises DistributedInitError unless the port can be bound, waiting up to
  `wait_s` seconds for a listener to let it go."""
  host, port = split_address(bind_address, '--coordinator_bind_address')
  deadline = time.monotonic() + wait_s
  for tries in itertools.count():
    try:
      _bind_once(host, port)
      return
    except OSError as e:
      if e.errno != errno.EADDRINUSE:
        raise DistributedInitError(
            f'cannot bind the coordinator to {bind_address}: {e}') from e
      if time.monotonic() >= deadline:
        raise DistributedInitError(
            f'the coordinator port {port} on {host or "every interface"} is '
            f'still in use after {wait_s:g} s, so process 0 cannot start the '
            'coordinator there. Choose a free port in --coordinator_address '
            '(or stop the program holding it).') from e
      if tries == 0:
        logging.warning(
            'the coordinator port %d is in use (an earlier '
            'attempt\'s coordinator still exiting?); waiting up '
            'to %g s for it', port, wait_s)
    time.sleep(0.5)


def bind_address(coordinator_address: str) -> tuple[Optional[str], str]:
  """Where process 0's coordinator listens when --coordinator_bind_address
  is not given, and why: the address the job names, so that the port is not
  open on interfaces the job does not use, where this machine has it.

  A name that resolves to a loopback address other than the job's own
  (Debian maps the host's name to 127.0.1.1) would shut the other hosts
  out, so such a name, and one this machine cannot bind, listen on every
  interface (None: JAX's default).

  Example:
    >>> bind_address('10.0.0.2:8476')
    ('10.0.0.2:8476', 'the address --coordinator_address names')
  """
  host, port = split_address(coordinator_address)
  try:
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
  except OSError:
    found = []
  literal = _is_ip(host)
  for family, _, _, _, sockaddr in found:
    ip = ipaddress.ip_address(sockaddr[0])
    if ip.is_loopback and not literal and host != 'localhost':
      break  # A host name mapped to loopback: other hosts use its real one.
    try:
      with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((sockaddr[0], 0))
    except OSError:
      continue  # Not this machine's address.
    shown = f'[{ip}]' if ip.version == 6 else str(ip)
    return f'{shown}:{port}', 'the address --coordinator_address names'
  return None, (f'{host} is not an address of this machine that other hosts '
                'reach')


def _is_ip(host: str) -> bool:
  try:
    ipaddress.ip_address(host)
    return True
  except ValueError:
    return False


def _wait_for_coordinator(host: str, port: int, timeout_s: float) -> None:
  deadline = time.monotonic() + timeout_s
  last_error = None
  while time.monotonic() < deadline:
    try:
      with socket.create_connection((host, port), timeout=2):
        return
    except OSError as e:
      last_error = e
      time.sleep(0.2)
  raise DistributedInitError(
      f'no coordinator answered at {host}:{port} within {timeout_s:g} s '
      f'(--initialization_timeout); last error: {last_error}. Check that '
      'process 0 is running and that --coordinator_address names its host '
      'and port as the other processes can reach it.')


def check_jax_untouched(config_file: str = '') -> None:
  """Raises DistributedInitError if JAX's backend is already initialised,
  naming `config_file` (the --config file, loaded before this) if known."""
  from runtime import coordination  # pylint: disable=g-import-not-at-top
  if coordination.backend_started():
    loaded = (f'the config {config_file} (or a module it imports) was loaded'
              if config_file else 'the config or a module imported by it was '
              'loaded')
    raise DistributedInitError(
        'JAX was used before jax.distributed.initialize: its backend is '
        'already initialised, so this process cannot join a multi-process '
        'job (and emulated device counts no longer apply). Something ran JAX '
        f'code while {loaded}, for example jax.device_count(), '
        'jax.devices() or jnp.zeros() at import time or in get_config(); '
        'move that code into the workload function (a global batch from '
        'the device count: set config.global_batch_size, or compute it in '
        'the workload).')


def _before_joining(options: CoordinatorFlags,
                    found: Optional[job_tls.Credentials]) -> CoordinatorFlags:
  """Process 0: chooses where its coordinator listens and checks the port
  is free. The others: wait for the coordinator and check it is this
  attempt's. Returns the options with the bind address chosen."""
  address = options.coordinator_address
  assert address is not None  # Only the flags' mode comes here.
  host, port = split_address(address)
  if options.process_id != 0:
    _wait_for_coordinator(host, port, options.initialization_timeout)
    if found is not None:
      # Process 0 waits this long for its port; a program holding it
      # answers meanwhile.
      port_wait = min(PORT_WAIT_S, options.initialization_timeout / 2)
      credentials.check_coordinator(host,
                                    port,
                                    found,
                                    timeout_s=10,
                                    wait_s=port_wait + 5)
    return options
  bind = options.coordinator_bind_address
  if not bind:
    bind, why = bind_address(address)
    logging.info(
        'the coordinator listens on %s (%s; '
        '--coordinator_bind_address chooses)', bind or 'every interface', why)
    options = dataclasses.replace(options, coordinator_bind_address=bind)
  # Half the join's time at most: the others' roll call, which would
  # blame process 0 for not joining, must not end first.
  _check_port_free(bind or f'0.0.0.0:{port}',
                   min(PORT_WAIT_S, options.initialization_timeout / 2))
  return options


def initialize(mode: str,
               options: CoordinatorFlags,
               roll: Optional[roll_call.RollCall] = None,
               local_device_ids: Optional[list[int]] = None) -> None:
  """Starts jax.distributed as `mode` says; must run before any JAX work.

  Args:
    mode: from `plan`.
    options: the launcher's flags.
    roll: the job's roll call, to name the processes that never join.
    local_device_ids: on a GPU host, the CUDA ordinals this process drives
      (launcher/common/gpus.py); None: JAX's choice.

  Raises:
    DistributedInitError: when JAX was used before this call, the coordinator
      port is taken, the coordinator cannot be reached in time, or JAX itself
      refuses.
  """
  import jax  # pylint: disable=g-import-not-at-top
  check_jax_untouched()
  if mode == SINGLE:
    return
  found = credentials.issue_for(options.tls, options.tls_dir,
                                options.process_id, jax.__version__)
  if mode == EXPLICIT:
    options = _before_joining(options, found)
  kwargs: dict[str, Any] = {}
  if mode == EXPLICIT:
    kwargs = dict(coordinator_address=options.coordinator_address,
                  num_processes=options.num_processes,
                  process_id=options.process_id)
  if local_device_ids is not None:
    # Never JAX's guess of SLURM_LOCALID as an ordinal (JAX 16788, 23452).
    kwargs['local_device_ids'] = local_device_ids
  if options.coordinator_bind_address:
    # On a detected cluster too: JAX otherwise listens on every interface.
    kwargs['coordinator_bind_address'] = options.coordinator_bind_address
  logging.info(
      'jax.distributed.initialize(%s)%s',
      ', '.join(f'{k}={v!r}' for k, v in kwargs.items()) or
      'detected from the cluster',
      f' with mutual TLS as {found.uri}' if found else '')
  if found is not None:
    kwargs.update(found.jax_kwargs())
  try:
    with roll_call.Watch(roll, options.initialization_timeout):
      # JAX's own timeout, which aborts without naming anyone, comes later.
      jax.distributed.initialize(
          initialization_timeout=int(options.initialization_timeout +
                                     JAX_HEARTBEAT_MARGIN_S),
          heartbeat_timeout_seconds=int(options.heartbeat_timeout +
                                        JAX_HEARTBEAT_MARGIN_S),
          shutdown_timeout_seconds=int(options.barrier_timeout),
          **kwargs)
  except Exception as e:  # JAX raises several types; name them all the same.
    raise DistributedInitError(f'jax.distributed.initialize failed ({mode}): '
                               f'{type(e).__name__}: {e}') from e


def prepare_environment(coordinator_address: Optional[str],
                        env: MutableMapping[str, str] = os.environ) -> None:
  """Warns about proxies and exempts the coordinator host from them."""
  host = split_address(coordinator_address)[0] if coordinator_address else None
  for warning in cluster.proxy_warnings(host, env):
    logging.warning('%s', warning)
  if host and cluster.proxy_set(env):
    cluster.exempt_from_proxy([host], env)
