"""Which cluster this process runs on, read from its environment alone.

JAX's own detection (jax._src.clusters) can query a metadata server; this
module only reads environment variables and installed packages, so the
launcher can decide, without network traffic and without touching JAX,
whether to let JAX detect the coordinator, process count and process id.
"""

import importlib.util
import os
from typing import Mapping, Optional


def _slurm(env: Mapping[str, str]) -> bool:
  # The same variables JAX's SlurmCluster requires.
  return all(k in env for k in ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST',
                                'SLURM_NTASKS', 'SLURM_PROCID',
                                'SLURM_LOCALID'))


def _open_mpi(env: Mapping[str, str]) -> bool:
  return 'OMPI_MCA_orte_hnp_uri' in env


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
    ('gke_tpu', _gke_tpu),
    ('kubernetes', _kubernetes),
    ('cloud_tpu_vm', _cloud_tpu_vm),
)


def detect(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
  """Names the cluster JAX can configure itself on, or None.

  Args:
    env: the environment to read; os.environ by default.

  Returns:
    'slurm', 'open_mpi', 'gke_tpu', 'kubernetes', 'cloud_tpu_vm' or None.

  Example:
    >>> detect({'OMPI_MCA_orte_hnp_uri': '1.0;tcp://10.0.0.1:1234'})
    'open_mpi'
  """
  env = os.environ if env is None else env
  for name, present in _DETECTORS:
    if present(env):
      return name
  return None

