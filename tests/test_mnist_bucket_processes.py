"""MNIST read from a gs:// bucket (fake-gcs-server on 127.0.0.1), as every
host of a multi-host job reads it: the files, then a 2-process job."""

import subprocess
import sys

import pytest

from runtime.workloads import mnist
from tests import gcs as gcs_lib
from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]


@pytest.fixture
def gcs(tmp_path):
  with gcs_lib.FakeGcs(tmp_path / 'gcs') as server:
    server.bucket('data')
    yield server


def _upload_synthetic(gcs, tmp_path, num_train=256, num_test=64) -> str:
  """Small synthetic MNIST files in gs://data/mnist; returns the URL."""
  local = tmp_path / 'mnist'
  mnist.write_synthetic(str(local), num_train=num_train, num_test=num_test)
  for path in sorted(local.iterdir()):
    gcs.write('data', f'mnist/{path.name}', path.read_bytes())
  return 'gs://data/mnist'


def test_the_files_read_from_a_bucket_as_from_a_disk(gcs, tmp_path):
  url = _upload_synthetic(gcs, tmp_path)
  code = ('import sys; from runtime.workloads import mnist; '
          'd = mnist.load(sys.argv[1]); '
          'print(sorted((k, v.shape) for k, v in d.items()))')
  read = subprocess.run([sys.executable, '-c', code, url],
                        env=helpers.launcher_env(**gcs.env()),
                        cwd=helpers.REPO,
                        capture_output=True,
                        text=True,
                        timeout=60,
                        check=False)
  assert read.returncode == 0, read.stderr
  local = {k: v.shape for k, v in mnist.load(str(tmp_path / 'mnist')).items()}
  assert read.stdout.strip() == str(sorted(local.items()))
  missing = subprocess.run([sys.executable, '-c', code, 'gs://data/none'],
                           env=helpers.launcher_env(**gcs.env()),
                           cwd=helpers.REPO,
                           capture_output=True,
                           text=True,
                           timeout=60,
                           check=False)
  assert missing.returncode != 0
  assert ('gs://data/none/train-images-idx3-ubyte[.gz]: no such file'
          in missing.stderr)


def test_a_two_process_job_trains_on_mnist_from_a_bucket(gcs, tmp_path):
  url = _upload_synthetic(gcs, tmp_path)
  workdir = tmp_path / 'work'
  result = helpers.run_launcher([
      '--config=configs/mnist.py', f'--config.data_dir={url}',
      '--config.steps=4', '--config.global_batch_size=64',
      '--config.eval_every=0', '--config.checkpointing=False',
      '--local_processes=2', '--local_devices=2', f'--workdir={workdir}'
  ],
                                env=helpers.launcher_env(**gcs.env()),
                                timeout=150)
  assert result.returncode == 0, result.output
  assert 'step 4/4' in result.output
  assert len(set(helpers.fingerprints(workdir))) == 1
