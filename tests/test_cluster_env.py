"""What the launcher reads from SLURM, Open MPI, Kubernetes and GKE variables.

The end-to-end cases start two launcher processes on 127.0.0.1 with the
variables `srun` or a Kubernetes indexed Job would set.
"""

import socket
import time

import pytest

from runtime.common import cluster
from runtime.common import exit_codes
from tests import helpers

pytestmark = pytest.mark.unit


@pytest.mark.parametrize('env, place', [
    ({}, cluster.Place(None, None)),
    ({'SLURM_PROCID': '3', 'SLURM_NTASKS': '4', 'SLURM_JOB_ID': '9'},
     cluster.Place(3, 4, 'SLURM_PROCID', 'SLURM_NTASKS')),
    ({'OMPI_COMM_WORLD_RANK': '1', 'OMPI_COMM_WORLD_SIZE': '2'},
     cluster.Place(1, 2, 'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE')),
    ({'JOB_COMPLETION_INDEX': '5', 'KUBERNETES_SERVICE_HOST': '10.0.0.1'},
     cluster.Place(5, None, 'JOB_COMPLETION_INDEX', '')),
    ({'JOB_COMPLETION_INDEX': '5', 'PODRUN_NUM_PROCESSES': '8'},
     cluster.Place(5, 8, 'JOB_COMPLETION_INDEX', 'PODRUN_NUM_PROCESSES')),
    ({'TPU_WORKER_ID': '1', 'TPU_WORKER_HOSTNAMES': 'h0,h1,h2,h3'},
     cluster.Place(1, 4, 'TPU_WORKER_ID', 'TPU_WORKER_HOSTNAMES')),
    # Several slices: JAX numbers processes across them; no expectation.
    ({'TPU_WORKER_ID': '1', 'TPU_WORKER_HOSTNAMES': 'h0,h1',
      'MEGASCALE_NUM_SLICES': '2'}, cluster.Place(None, None)),
    # The launcher's own variables win over the scheduler's.
    ({'PODRUN_PROCESS_ID': '0', 'PODRUN_NUM_PROCESSES': '2',
      'SLURM_PROCID': '3', 'SLURM_NTASKS': '4'},
     cluster.Place(0, 2, 'PODRUN_PROCESS_ID', 'PODRUN_NUM_PROCESSES')),
])
def test_place_reads_each_scheduler(env, place):
  assert cluster.place(env) == place


@pytest.mark.parametrize('env, message', [
    ({'SLURM_PROCID': 'x', 'SLURM_NTASKS': '2'},
     "SLURM_PROCID='x' is not an integer"),
    ({'SLURM_PROCID': '2', 'SLURM_NTASKS': '2'},
     'SLURM_PROCID=2 is outside [0, SLURM_NTASKS=2)'),
    ({'OMPI_COMM_WORLD_RANK': '-1'}, 'OMPI_COMM_WORLD_RANK=-1 is negative'),
])
def test_bad_values_name_the_variable(env, message):
  with pytest.raises(cluster.ClusterEnvError) as e:
    cluster.place(env)
  assert message in str(e.value)


def test_kubernetes_indexed_job_gives_explicit_options():
  env = {'PODRUN_COORDINATOR_ADDRESS': 'train-0.train:8476',
         'PODRUN_NUM_PROCESSES': '4', 'JOB_COMPLETION_INDEX': '2',
         'KUBERNETES_SERVICE_HOST': '10.0.0.1'}
  assert cluster.explicit_options(env) == {
      'coordinator_address': ('train-0.train:8476',
                              'PODRUN_COORDINATOR_ADDRESS'),
      'num_processes': (4, 'PODRUN_NUM_PROCESSES'),
      'process_id': (2, 'JOB_COMPLETION_INDEX')}
  # Without a coordinator, the index alone does not make a job.
  assert cluster.explicit_options({'JOB_COMPLETION_INDEX': '2'}) == {}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _two_processes(tmp_path, env_of, extra_args=()):
  started = time.monotonic()
  procs = [helpers.start_launcher(
      ['--config=configs/linear_regression.py', f'--workdir={tmp_path}',
       '--config.steps=20', '--local_devices=4', '--initialization_timeout=60',
       *extra_args], env=helpers.launcher_env(**env_of(i)))
           for i in range(2)]
  try:
    return [helpers.finish(p, 150, started) for p in procs]
  finally:
    for p in procs:
      helpers.kill_group(p)


@pytest.mark.processes
@pytest.mark.timeout(200)
def test_srun_style_job_is_detected_by_jax(tmp_path):
  port = _free_port()
  results = _two_processes(tmp_path, lambda i: {
      'SLURM_JOB_ID': '4242', 'SLURM_STEP_NODELIST': '127.0.0.1',
      'SLURM_NTASKS': '2', 'SLURM_PROCID': str(i), 'SLURM_LOCALID': str(i),
      'SLURM_STEP_NUM_NODES': '1', 'JAX_COORDINATOR_PORT': str(port),
      'JAX_COORDINATOR_BIND_ADDRESS': f'127.0.0.1:{port}'})
  for r in results:
    assert r.returncode == 0, r.output
  # Named from SLURM_PROCID / SLURM_NTASKS before JAX starts.
  line = helpers.first_line_with(results[0].stderr, 'detected from the cluster')
  assert line and line.startswith('[rank 0/2] '), results[0].stderr
  prints = [helpers.read_json(tmp_path / 'ranks' / f'rank_{i}.json')
            for i in range(2)]
  assert prints[0]['fingerprint'] == prints[1]['fingerprint']
  assert helpers.read_json(tmp_path / 'summary.json')['device_count'] == 8


@pytest.mark.processes
@pytest.mark.timeout(200)
def test_kubernetes_style_job_from_the_environment(tmp_path):
  address = f'127.0.0.1:{_free_port()}'
  results = _two_processes(tmp_path, lambda i: {
      'KUBERNETES_SERVICE_HOST': '127.0.0.1', 'JOB_COMPLETION_INDEX': str(i),
      'PODRUN_COORDINATOR_ADDRESS': address, 'PODRUN_NUM_PROCESSES': '2',
      'PODRUN_COORDINATOR_BIND_ADDRESS': address})
  for r in results:
    assert r.returncode == 0, r.output
  assert f"coordinator_address='{address}'" in results[0].stderr
  assert helpers.read_json(tmp_path / 'summary.json')['process_count'] == 2


@pytest.mark.processes
def test_accelerator_type_names_every_factor_on_the_wrong_machine(tmp_path):
  result = helpers.run_launcher(
      ['--config=configs/linear_regression.py', f'--workdir={tmp_path}',
       '--config.topology.accelerator_type=v4-16'])
  assert result.returncode == exit_codes.TOPOLOGY_MISMATCH, result.output
  for factor in ('num_processes: config.topology.accelerator_type=v4-16 '
                 'expects 2, but 1',
                 'local_devices: config.topology.accelerator_type=v4-16 '
                 'expects 4, but 8',
                 'platform: config.topology.accelerator_type=v4-16 expects '
                 'tpu, but cpu'):
    assert factor in result.stderr


@pytest.mark.processes
def test_unknown_accelerator_type_is_a_config_error(tmp_path):
  result = helpers.run_launcher(
      ['--config=configs/linear_regression.py', f'--workdir={tmp_path}',
       '--config.topology.accelerator_type=v9-8'])
  assert result.returncode == exit_codes.CONFIG_ERROR, result.output
  assert "unknown generation 'v9'" in result.stderr
