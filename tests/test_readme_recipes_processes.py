"""The docs' multi-host recipes, read from the pages themselves and run
against the emulations: the Cloud TPU ones on the fake gcloud (workers
whose image has Python 3.10, as tpu-ubuntu2204-base has), the Ray one on a
local Ray cluster, MNIST in a fake-gcs-server bucket.

Each recipe runs as written, but for what names a real machine and what
the emulation needs, all in `_emulated`:
- the bucket `gs://BUCKET` is the emulator's, `/shared` a directory here,
  `--address=auto` the local cluster, `{"GPU": 8}` its `{"host": 1}`;
- the TPU launch gets --skip_preflight (no Cloud TPU API here),
  --worker_python=python3.X (the name --provision_python installs; else a
  worker would pip-install JAX for TPUs) and --log_dir; every job gets
  --local_devices (CPU devices) and a few steps of MNIST.
"""

import json
import re
import shlex
import subprocess
import sys
import time

import pytest

from runtime.workloads import mnist
from tests import gcs as gcs_lib
from tests import helpers
from tests import ray_cluster  # Before Ray: it keeps Ray on 127.0.0.1.
from tests import tpu_emulation

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

# Where the recipes are: the README and every page of the docs.
PAGES = [helpers.REPO / 'README.md',
         *sorted((helpers.REPO / 'docs').rglob('*.md'))]
SHORT = ['--config.steps=3', '--config.global_batch_size=64',
         '--config.eval_every=0']


def recipe(first_words: str, holding: str = '') -> list[str]:
  """The docs' shell command (continuations joined, comments dropped)
  that starts with `first_words` and holds `holding`, as words.

  Raises:
    AssertionError: naming what was looked for, when no command or more
      than one matches.
  """
  found = []
  every_page = '\n'.join(page.read_text() for page in PAGES)
  for block in re.findall(r'```sh\n(.*?)```', every_page, re.S):
    for command in block.replace('\\\n', ' ').splitlines():
      if not command.startswith(first_words.split()[0]):
        continue  # Not a command of that program.
      try:
        words = shlex.split(command, comments=True)
      except ValueError:  # A quote that goes on over lines: not a recipe's.
        continue
      text = ' '.join(words)
      if text.startswith(first_words) and holding in text:
        found.append(words)
  assert len(found) == 1, (
      f'{len(found)} commands of the docs start with {first_words!r} and hold '
      f'{holding!r}: {found}')
  return found[0]


def _emulated(words: list[str], replace: dict[str, str]) -> list[str]:
  """`words` with each `replace` key replaced, in every word."""
  out = []
  for word in words:
    for old, new in replace.items():
      word = word.replace(old, new)
    out.append(word)
  return out


def _tpu_args(words: list[str], logs) -> list[str]:
  """A launch_tpu_pod.sh recipe's words, with the emulation's own flags
  before `--` and CPU devices after it."""
  at = words.index('--')
  return [*words[1:at], '--skip_preflight',
          f'--worker_python={tpu_emulation.WORKER_PYTHON}',
          f'--log_dir={logs}', *words[at:], '--local_devices=4']


@pytest.fixture
def gcs(tmp_path):
  with gcs_lib.FakeGcs(tmp_path / 'gcs') as server:
    server.bucket('bucket')
    local = tmp_path / 'mnist'
    mnist.write_synthetic(str(local), num_train=512, num_test=64)
    for path in sorted(local.iterdir()):
      server.write('bucket', f'mnist-data/{path.name}', path.read_bytes())
    yield server


def _pod(tmp_path, gcs, **env) -> tpu_emulation.FakePod:
  """Four workers (a v4-32) on the Ubuntu 22.04 image, reaching the bucket."""
  ubuntu = tpu_emulation.ubuntu_2204_path(tmp_path)
  paths = {f'FAKE_TPU_WORKER_PATH_{w}': ubuntu for w in range(4)}
  return tpu_emulation.FakePod(
      tmp_path, workers=4, FAKE_TPU_WORKER_ENV=json.dumps(gcs.env()),
      **paths, **gcs.env(), **env)


def _run(pod, args, timeout=240) -> helpers.Result:
  started = time.monotonic()
  proc = subprocess.Popen(
      [tpu_emulation.SCRIPT, *args], cwd=helpers.REPO, env=pod.env,
      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    return helpers.finish(proc, timeout, started)
  finally:
    helpers.kill_group(proc)
    pod.kill_leftovers()


def test_the_tpu_quick_recipe_on_an_existing_slice(tmp_path, gcs):
  """About 20 s: four workers provisioned with Python, then the job."""
  # `gcloud compute tpus tpu-vm create my-pod ... v4-32` is the emulation's
  # own pod, of that name and type.
  create = recipe('gcloud compute tpus tpu-vm create my-pod')
  assert '--accelerator-type=v4-32' in create
  pod = _pod(tmp_path, gcs, FAKE_TPU_NAME='my-pod',
             FAKE_TPU_ACCELERATOR_TYPE='v4-32')
  words = recipe('scripts/launch_tpu_pod.sh --tpu=my-pod', 'linear_regression')
  result = _run(pod, _tpu_args(
      _emulated(words, {'gs://BUCKET': 'gs://bucket'}), pod.logs))
  assert result.returncode == 0, result.output
  assert 'installing Python' in result.stderr  # --provision_python did.
  summary = json.loads(gcs.read('bucket', 'lr/summary.json'))
  assert (summary['process_count'], summary['device_count']) == (4, 16)


def test_the_tpu_spot_recipe_creates_trains_on_mnist_and_deletes(tmp_path,
                                                                gcs):
  """About 30 s: a queued resource created, four workers provisioned, MNIST
  from the bucket, the slice deleted after."""
  words = recipe('scripts/launch_tpu_pod.sh --tpu=my-v4-32', '--create')
  pod = _pod(tmp_path, gcs, FAKE_QR_WAIT_S='0.5', FAKE_QR_PROVISION_S='0.5',
             FAKE_TPU_NAME='unused')
  result = _run(pod, [*_tpu_args(
      _emulated(words, {'gs://BUCKET': 'gs://bucket'}), pod.logs),
                      *SHORT])
  assert result.returncode == 0, result.output
  assert 'installing Python' in result.stderr
  assert ('the job ended (--delete_after): deleting queued resource '
          'my-v4-32') in result.stderr
  assert pod.queued_resources() == []
  summary = json.loads(gcs.read('bucket', 'mnist/summary.json'))
  assert (summary['process_count'], summary['device_count']) == (4, 16)


def test_the_ray_recipe_on_a_local_cluster(tmp_path):
  """About 25 s: a 4-node Ray cluster of its own, then MNIST from /shared."""
  pytest.importorskip('ray')
  shared = tmp_path / 'shared'
  mnist.write_synthetic(str(shared / 'mnist-data'), num_train=512,
                        num_test=64)
  words = recipe('podrun-ray --address=auto --num_processes=4 '
                 '--resources_per_process={"GPU": 8} --')
  with ray_cluster.RayCluster(nodes=4) as cluster:
    emulated = _emulated(words, {
        '--address=auto': f'--address={cluster.address}',
        '{"GPU": 8}': '{"host": 1}', '/shared': str(shared)})
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, '-m', 'launcher.ray', *emulated[1:],
         '--local_devices=2', *SHORT], cwd=helpers.REPO,
        env=helpers.launcher_env(**ray_cluster.ENV),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
      result = helpers.finish(proc, 200, started)
    finally:
      helpers.kill_group(proc)
  assert result.returncode == 0, result.output
  summary = helpers.read_json(shared / 'mnist' / 'summary.json')
  assert (summary['process_count'], summary['device_count']) == (4, 8)
