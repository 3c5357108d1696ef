"""Which cluster this process runs on, read from its environment alone.

JAX's own detection (jax._src.clusters) can query a metadata server; this
module only reads environment variables and installed packages, so the
launcher can decide, without network traffic and without touching JAX,
whether to let JAX detect the coordinator, process count and process id.
"""

import dataclasses
import importlib.util
import os
from typing import Mapping, MutableMapping, Optional

from runtime.common import exit_codes
from runtime.common import handoff

# A scheduler hands each process its place through the hand-off's
# coordinator, process count and process id (runtime/common/handoff.py); a
# Kubernetes indexed Job gives the process id as JOB_COMPLETION_INDEX
# instead.
_K8S_INDEX = 'JOB_COMPLETION_INDEX'

# --cluster: AUTO joins the cluster the environment names (or none); NONE
# runs one process alone on every device of its host, whatever is around it.
AUTO = 'auto'
NONE = 'none'
CHOICES = (AUTO, NONE)


def _slurm(env: Mapping[str, str]) -> bool:
  # The same variables JAX's SlurmCluster requires.
  return all(k in env
             for k in ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS',
                       'SLURM_PROCID', 'SLURM_LOCALID'))


def _open_mpi(env: Mapping[str, str]) -> bool:
  return 'OMPI_MCA_orte_hnp_uri' in env


def _open_mpi_5(env: Mapping[str, str]) -> bool:
  # Open MPI 5 runs on PRRTE and PMIx, without ORTE's URI that JAX's
  # OmpiCluster looks for (JAX 14576): its ranks know their rank and size,
  # and no coordinator.
  return ('OMPI_COMM_WORLD_RANK' in env and
          'OMPI_MCA_orte_hnp_uri' not in env and
          any(k.startswith(('PMIX_', 'PRTE_')) for k in env))


def _gke_tpu(env: Mapping[str, str]) -> bool:
  return 'TPU_WORKER_HOSTNAMES' in env or 'TPU_PROCESS_ADDRESSES' in env


def _cloud_tpu_vm(env: Mapping[str, str]) -> bool:
  # JAX asks the TPU VM's metadata server only where libtpu is installed.
  del env
  return importlib.util.find_spec('libtpu') is not None


def _kubernetes(env: Mapping[str, str]) -> bool:
  return 'KUBERNETES_SERVICE_HOST' in env and 'JOB_COMPLETION_INDEX' in env


_DETECTORS = (
    ('slurm', _slurm),
    ('open_mpi', _open_mpi),
    ('open_mpi_5', _open_mpi_5),
    ('gke_tpu', _gke_tpu),
    ('kubernetes', _kubernetes),
    ('cloud_tpu_vm', _cloud_tpu_vm),
)


def job_id(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
  """The job's identity, the same on every attempt and process of it, where
  the environment tells one: PODRUN_JOB_ID (every podrun launcher sets it),
  else SLURM's job id; None for processes started by hand without it."""
  env = os.environ if env is None else env
  told = _handoff(env).job_id
  if told:
    return told
  if env.get('SLURM_JOB_ID'):
    return f'slurm-{env["SLURM_JOB_ID"]}'
  return None


def detect(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
  """Names the cluster JAX can configure itself on, or None.

  Args:
    env: the environment to read; os.environ by default.

  Returns:
    'slurm', 'open_mpi', 'open_mpi_5' (no ORTE: podrun, not JAX, reads
    its rank and size), 'gke_tpu', 'kubernetes', 'cloud_tpu_vm' or None.

  Example:
    >>> detect({'OMPI_MCA_orte_hnp_uri': '1.0;tcp://10.0.0.1:1234'})
    'open_mpi'
  """
  env = os.environ if env is None else env
  for name, present in _DETECTORS:
    if present(env):
      return name
  return None


class ClusterEnvError(exit_codes.ConfigError):
  """A cluster variable holds something that is not what it should be."""


def _handoff(env: Mapping[str, str]) -> handoff.Handoff:
  try:
    return handoff.Handoff.read(env)
  except handoff.HandoffError as e:
    raise ClusterEnvError(str(e)) from None


def _int(env: Mapping[str, str], name: str) -> Optional[int]:
  value = env.get(name)
  if value is None or value == '':
    return None
  try:
    return int(value)
  except ValueError:
    raise ClusterEnvError(f'{name}={value!r} is not an integer') from None


@dataclasses.dataclass(frozen=True)
class Place:
  """Where the environment puts this process: (id, count) and who said so.

  Attributes:
    process_index: this process's index, or None when the environment is
      silent.
    num_processes: processes in the job, or None.
    id_source: the variable process_index came from.
    count_source: the variable num_processes came from.
  """
  process_index: Optional[int]
  num_processes: Optional[int]
  id_source: str = ''
  count_source: str = ''


def _count(var: str):
  return lambda env: (_int(env, var), var)


def _told(field: str):
  return lambda env: (getattr(_handoff(env), field), handoff.variable(field))


def _tpu_worker_count(env: Mapping[str, str]):
  hosts = env.get('TPU_WORKER_HOSTNAMES')
  return (len(hosts.split(',')) if hosts else None), 'TPU_WORKER_HOSTNAMES'


# (env -> (process id or None, its variable), env -> (process count or
# None, its variable)), in this order.
_PLACES = (
    (_told('process_id'), _told('num_processes')),
    (_count('SLURM_PROCID'), _count('SLURM_NTASKS')),
    (_count('OMPI_COMM_WORLD_RANK'), _count('OMPI_COMM_WORLD_SIZE')),
    (_count(_K8S_INDEX), _told('num_processes')),
    (_count('TPU_WORKER_ID'), _tpu_worker_count),
)


def place(env: Optional[Mapping[str, str]] = None) -> Place:
  """This process's index and the process count as the scheduler set them.

  Reads, in order, PODRUN_PROCESS_ID / PODRUN_NUM_PROCESSES, SLURM
  (SLURM_PROCID / SLURM_NTASKS), Open MPI (OMPI_COMM_WORLD_RANK /
  OMPI_COMM_WORLD_SIZE), a Kubernetes indexed Job (JOB_COMPLETION_INDEX) and
  GKE TPU (TPU_WORKER_ID, and the count of TPU_WORKER_HOSTNAMES). The
  launcher names ranks in its logs and checks the running pod with these.

  Raises:
    ClusterEnvError: naming a variable that is not an integer, or an id
      outside [0, count).

  Example:
    >>> place({'SLURM_PROCID': '3', 'SLURM_NTASKS': '4'})
    Place(process_index=3, num_processes=4, id_source='SLURM_PROCID', ...)
  """
  env = os.environ if env is None else env
  for read_id, read_count in _PLACES:
    process_index, id_var = read_id(env)
    if process_index is None:
      continue
    if id_var == 'TPU_WORKER_ID' and (_int(env, 'MEGASCALE_NUM_SLICES') or
                                      1) > 1:
      # Several slices: JAX numbers processes across them; the worker id
      # is only the place within one slice.
      return Place(None, None)
    count, count_source = read_count(env)
    if count is None:
      count_source = ''
    if process_index < 0 or (count is not None and process_index >= count):
      raise ClusterEnvError(
          f'{id_var}={process_index} is outside [0, {count_source}={count})'
          if count is not None else f'{id_var}={process_index} is negative')
    return Place(process_index, count, id_var, count_source)
  return Place(None, None)


def explicit_options(
    env: Optional[Mapping[str, str]] = None) -> dict[str, tuple[object, str]]:
  """What PODRUN_* (and JOB_COMPLETION_INDEX, and under Open MPI 5 the
  rank and size) say of the launcher's flags.

  Returns:
    {flag name: (value, variable)} for coordinator_address, num_processes,
    process_id and coordinator_bind_address, holding only those set.

  Example:
    >>> explicit_options({'PODRUN_COORDINATOR_ADDRESS': 'job-0.svc:8476',
    ...                   'PODRUN_NUM_PROCESSES': '4',
    ...                   'JOB_COMPLETION_INDEX': '2'})['process_id']
    (2, 'JOB_COMPLETION_INDEX')
  """
  env = os.environ if env is None else env
  told = _handoff(env)
  found = {
      flag: (getattr(told, flag), handoff.variable(flag))
      for flag in ('coordinator_address', 'coordinator_bind_address',
                   'num_processes', 'process_id')
      if getattr(told, flag) is not None
  }
  index = _int(env, _K8S_INDEX)
  if 'process_id' not in found and index is not None and (
      told.coordinator_address is not None):
    found['process_id'] = (index, _K8S_INDEX)
  if _open_mpi_5(env):
    for flag, var in (('process_id', 'OMPI_COMM_WORLD_RANK'),
                      ('num_processes', 'OMPI_COMM_WORLD_SIZE')):
      if flag not in found and _int(env, var) is not None:
        found[flag] = (_int(env, var), var)
  return found


# gRPC (the coordination service) honours these.
PROXY_VARS = ('http_proxy', 'https_proxy', 'grpc_proxy', 'all_proxy',
              'HTTP_PROXY', 'HTTPS_PROXY', 'GRPC_PROXY', 'ALL_PROXY')


def proxy_set(env: Mapping[str, str]) -> bool:
  """Whether any proxy variable that gRPC honours is set in `env`."""
  return any(env.get(k) for k in PROXY_VARS)


def proxy_warnings(coordinator_host: Optional[str],
                   env: Mapping[str, str]) -> list[str]:
  """Says which proxy variables could route the coordinator's gRPC traffic.

  gRPC honours http(s)_proxy, grpc_proxy and no_proxy; a proxy that cannot
  reach the coordinator makes initialisation hang until its timeout.
  """
  set_vars = [k for k in PROXY_VARS if env.get(k)]
  if not set_vars:
    return []
  exempt = [
      h.strip() for h in (env.get('no_proxy', '') + ',' +
                          env.get('NO_PROXY', '')).split(',') if h.strip()
  ]
  if coordinator_host and (coordinator_host in exempt or '*' in exempt):
    return []
  target = coordinator_host or 'the coordinator'
  return [
      f'proxy variables {", ".join(set_vars)} are set and {target} is not '
      'in no_proxy: jax.distributed.initialize may hang until its '
      'timeout. The launcher adds the coordinator host to no_proxy for '
      'this process; unset them if initialisation still hangs.'
  ]


def exempt_from_proxy(hosts: list[str], env: MutableMapping[str, str]) -> None:
  """Adds hosts to no_proxy and NO_PROXY in `env`, keeping what is there."""
  for key in ('no_proxy', 'NO_PROXY'):
    current = [h for h in env.get(key, '').split(',') if h]
    env[key] = ','.join(current + [h for h in hosts if h not in current])
