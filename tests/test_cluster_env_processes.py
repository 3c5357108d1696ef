"""Jobs whose place comes from SLURM- and Kubernetes-style variables, and
accelerator types that do not match the machine, run as launcher processes."""

import socket
import time

import pytest

from runtime.common import exit_codes
from tests import helpers

pytestmark = pytest.mark.processes


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _two_processes(tmp_path, env_of, extra_args=()):
  started = time.monotonic()
  procs = [
      helpers.start_launcher([
          '--config=configs/linear_regression.py', f'--workdir={tmp_path}',
          '--config.steps=20', '--local_devices=4',
          '--initialization_timeout=60', *extra_args
      ],
                             env=helpers.launcher_env(**env_of(i)))
      for i in range(2)
  ]
  try:
    return [helpers.finish(p, 150, started) for p in procs]
  finally:
    for p in procs:
      helpers.kill_group(p)


@pytest.mark.timeout(200)
def test_srun_style_job_is_detected_by_jax(tmp_path):
  port = _free_port()
  results = _two_processes(
      tmp_path, lambda i: {
          'SLURM_JOB_ID': '4242',
          'SLURM_STEP_NODELIST': '127.0.0.1',
          'SLURM_NTASKS': '2',
          'SLURM_PROCID': str(i),
          'SLURM_LOCALID': str(i),
          'SLURM_STEP_NUM_NODES': '1',
          'JAX_COORDINATOR_PORT': str(port),
          'JAX_COORDINATOR_BIND_ADDRESS': f'127.0.0.1:{port}'
      })
  for r in results:
    assert r.returncode == 0, r.output
  # Named from SLURM_PROCID / SLURM_NTASKS before JAX starts.
  line = helpers.first_line_with(results[0].stderr, 'detected from the cluster')
  assert line and line.startswith('[rank 0/2] '), results[0].stderr
  prints = [
      helpers.read_json(tmp_path / 'ranks' / f'rank_{i}.json') for i in range(2)
  ]
  assert prints[0]['fingerprint'] == prints[1]['fingerprint']
  assert helpers.read_json(tmp_path / 'summary.json')['device_count'] == 8


@pytest.mark.timeout(200)
def test_kubernetes_style_job_from_the_environment(tmp_path):
  address = f'127.0.0.1:{_free_port()}'
  results = _two_processes(
      tmp_path, lambda i: {
          'KUBERNETES_SERVICE_HOST': '127.0.0.1',
          'JOB_COMPLETION_INDEX': str(i),
          'PODRUN_COORDINATOR_ADDRESS': address,
          'PODRUN_NUM_PROCESSES': '2',
          'PODRUN_COORDINATOR_BIND_ADDRESS': address
      })
  for r in results:
    assert r.returncode == 0, r.output
  assert f"coordinator_address='{address}'" in results[0].stderr
  assert helpers.read_json(tmp_path / 'summary.json')['process_count'] == 2


def test_accelerator_type_names_every_factor_on_the_wrong_machine(tmp_path):
  result = helpers.run_launcher([
      '--config=configs/linear_regression.py', f'--workdir={tmp_path}',
      '--config.topology.accelerator_type=v4-16'
  ])
  assert result.returncode == exit_codes.TOPOLOGY_MISMATCH, result.output
  for factor in ('num_processes: config.topology.accelerator_type=v4-16 '
                 'expects 2, but 1',
                 'local_devices: config.topology.accelerator_type=v4-16 '
                 'expects 4, but 8',
                 'platform: config.topology.accelerator_type=v4-16 expects '
                 'tpu, but cpu'):
    assert factor in result.stderr


def test_unknown_accelerator_type_is_a_config_error(tmp_path):
  result = helpers.run_launcher([
      '--config=configs/linear_regression.py', f'--workdir={tmp_path}',
      '--config.topology.accelerator_type=v9-8'
  ])
  assert result.returncode == exit_codes.CONFIG_ERROR, result.output
  assert "unknown generation 'v9'" in result.stderr
