"""What the launcher reads from SLURM, Open MPI, Kubernetes and GKE variables.

The end-to-end cases start two launcher processes on 127.0.0.1 with the
variables `srun` or a Kubernetes indexed Job would set.
"""

import pytest

from launcher.common import cluster

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    'env, place',
    [
        ({}, cluster.Place(None, None)),
        ({
            'SLURM_PROCID': '3',
            'SLURM_NTASKS': '4',
            'SLURM_JOB_ID': '9'
        }, cluster.Place(3, 4, 'SLURM_PROCID', 'SLURM_NTASKS')),
        ({
            'OMPI_COMM_WORLD_RANK': '1',
            'OMPI_COMM_WORLD_SIZE': '2'
        }, cluster.Place(1, 2, 'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE')),
        ({
            'JOB_COMPLETION_INDEX': '5',
            'KUBERNETES_SERVICE_HOST': '10.0.0.1'
        }, cluster.Place(5, None, 'JOB_COMPLETION_INDEX', '')),
        ({
            'JOB_COMPLETION_INDEX': '5',
            'PODRUN_NUM_PROCESSES': '8'
        }, cluster.Place(5, 8, 'JOB_COMPLETION_INDEX', 'PODRUN_NUM_PROCESSES')),
        ({
            'TPU_WORKER_ID': '1',
            'TPU_WORKER_HOSTNAMES': 'h0,h1,h2,h3'
        }, cluster.Place(1, 4, 'TPU_WORKER_ID', 'TPU_WORKER_HOSTNAMES')),
        # Several slices: JAX numbers processes across them; no expectation.
        ({
            'TPU_WORKER_ID': '1',
            'TPU_WORKER_HOSTNAMES': 'h0,h1',
            'MEGASCALE_NUM_SLICES': '2'
        }, cluster.Place(None, None)),
        # The launcher's own variables win over the scheduler's.
        ({
            'PODRUN_PROCESS_ID': '0',
            'PODRUN_NUM_PROCESSES': '2',
            'SLURM_PROCID': '3',
            'SLURM_NTASKS': '4'
        }, cluster.Place(0, 2, 'PODRUN_PROCESS_ID', 'PODRUN_NUM_PROCESSES')),
    ])
def test_place_reads_each_scheduler(env, place):
  assert cluster.place(env) == place


@pytest.mark.parametrize('env, message', [
    ({
        'SLURM_PROCID': 'x',
        'SLURM_NTASKS': '2'
    }, "SLURM_PROCID='x' is not an integer"),
    ({
        'SLURM_PROCID': '2',
        'SLURM_NTASKS': '2'
    }, 'SLURM_PROCID=2 is outside [0, SLURM_NTASKS=2)'),
    ({
        'OMPI_COMM_WORLD_RANK': '-1'
    }, 'OMPI_COMM_WORLD_RANK=-1 is negative'),
])
def test_bad_values_name_the_variable(env, message):
  with pytest.raises(cluster.ClusterEnvError) as e:
    cluster.place(env)
  assert message in str(e.value)


def test_kubernetes_indexed_job_gives_explicit_options():
  env = {
      'PODRUN_COORDINATOR_ADDRESS': 'train-0.train:8476',
      'PODRUN_NUM_PROCESSES': '4',
      'JOB_COMPLETION_INDEX': '2',
      'KUBERNETES_SERVICE_HOST': '10.0.0.1'
  }
  assert cluster.explicit_options(env) == {
      'coordinator_address':
          ('train-0.train:8476', 'PODRUN_COORDINATOR_ADDRESS'),
      'num_processes': (4, 'PODRUN_NUM_PROCESSES'),
      'process_id': (2, 'JOB_COMPLETION_INDEX')
  }
  # Without a coordinator, the index alone does not make a job.
  assert cluster.explicit_options({'JOB_COMPLETION_INDEX': '2'}) == {}
