"""A TPU host as it comes: libtpu installed, no cluster to join. The default
job runs on one process and says why, whether the metadata server refuses,
never answers, or names one worker (launcher/process/tpu_metadata.py)."""

import socket
import subprocess
import time

import pytest

from runtime.common import version
from tests import helpers
from tests.test_distributed import _metadata_server
from tests.test_distributed import _refusing_address
from tests.test_distributed import _silent_server

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]

_ALONE = "one process on all of this host's devices, no coordinator: "


@pytest.fixture
def tpu_image(tmp_path):
  """PYTHONPATH with an empty module named libtpu, as on a TPU image."""
  (tmp_path / 'site' / 'libtpu').mkdir(parents=True)
  (tmp_path / 'site' / 'libtpu' / '__init__.py').write_text('')
  return str(tmp_path / 'site')


def _run_sh(tmp_path, site: str, metadata: str, *args: str):
  env = helpers.launcher_env(PYTHONPATH=f'{helpers.REPO}:{site}',
                             GCE_METADATA_IP=metadata)
  # JAX sets it on import where it finds no TPU chip, as here in pytest.
  env.pop('TPU_SKIP_MDS_QUERY', None)
  started = time.monotonic()
  result = subprocess.run([
      'bash', 'scripts/run.sh', f'--workdir={tmp_path}/job',
      '--config.steps=20', *args
  ],
                          cwd=helpers.REPO,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=150,
                          check=False)
  return result, time.monotonic() - started


def _summary(tmp_path) -> dict:
  return helpers.read_json(tmp_path / 'job' / 'summary.json')


def test_run_sh_on_a_tpu_host_without_a_metadata_server(tmp_path, tpu_image):
  where = _refusing_address()
  result, _ = _run_sh(tmp_path, tpu_image, where)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (f'{_ALONE}libtpu is installed but {where} cannot be reached '
          '(ConnectionRefusedError') in result.stderr
  assert _summary(tmp_path)['process_count'] == 1


def test_a_metadata_server_that_never_answers_costs_its_bound(
    tmp_path, tpu_image):
  with _silent_server() as where:
    result, _ = _run_sh(tmp_path, tpu_image, where)
  assert result.returncode == 0, result.stderr[-3000:]
  line = helpers.first_line_with(result.stderr, _ALONE)
  assert line and line.endswith(
      f'libtpu is installed but no answer from {where} within 2 s'), line
  assert _summary(tmp_path)['process_count'] == 1


def test_a_metadata_server_naming_one_worker(tmp_path, tpu_image):
  with _metadata_server('t1v-n-0-w-0:0:10.0.0.2') as where:
    result, _ = _run_sh(tmp_path, tpu_image, where)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (f'{_ALONE}the TPU metadata server at {where} names one worker'
          in result.stderr)


def test_cluster_none_runs_alone_inside_a_cluster_s_variables(tmp_path):
  # SLURM's variables of a step of two tasks: --cluster=none runs alone.
  slurm = {
      'SLURM_JOB_ID': '7',
      'SLURM_STEP_NODELIST': 'n[1-2]',
      'SLURM_NTASKS': '2',
      'SLURM_PROCID': '0',
      'SLURM_LOCALID': '0'
  }
  result = helpers.run_launcher([
      '--config=configs/linear_regression.py', f'--workdir={tmp_path}/job',
      '--config.steps=5', '--cluster=none'
  ],
                                env=helpers.launcher_env(**slurm))
  assert result.returncode == 0, result.stderr[-3000:]
  assert f'{_ALONE}--cluster=none' in result.stderr
  # The process's first line names podrun's version.
  assert f'podrun {version.podrun()}, {_ALONE}' in result.stderr
