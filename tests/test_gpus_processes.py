"""A local pod on a GPU host, the host's nvidia-smi a fake that lists 8
H200s (tests/fake_nvidia): each process is given its own GPUs, says them,
and keeps its setup in run.json; a layout that would share a GPU is refused
before anything starts. JAX itself runs on the CPU here."""

import os
import pathlib
import re

import pytest

from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(200)]

FAKE_DIR = pathlib.Path(__file__).parent / 'fake_nvidia'


def _gpu_env():
  return helpers.launcher_env(
      PATH=f'{FAKE_DIR}{os.pathsep}{os.environ["PATH"]}')


def _launch(tmp_path, *args, timeout=150):
  return helpers.finish(
      helpers.start_launcher(
          [f'--config={helpers.PROBE_CONFIG}', f'--workdir={tmp_path}', *args],
          env=_gpu_env()), timeout, 0)


def test_a_pod_of_8_on_8_gpus_gives_each_process_one(tmp_path):
  result = _launch(tmp_path, '--local_processes=8', '--dry_run')
  assert result.returncode == 0, result.output
  visible = re.findall(r'CUDA_VISIBLE_DEVICES=(\S+)', result.stdout)
  assert visible == [str(i) for i in range(8)], result.stdout
  assert '8 processes x 1 GPU(s) each' in result.stdout
  assert '--local_devices' not in result.stdout


def test_a_pod_of_2_drives_4_gpus_each_and_says_so(tmp_path):
  """About 15 s: a real 2-process run of 4 steps."""
  result = _launch(tmp_path, '--local_processes=2', '--config.steps=4',
                   '--config.global_batch_size=8', '--gpu_memory_fraction=0.9')
  assert result.returncode == 0, result.output
  assert ('rank 1 drives GPU 4 (GPU-00000004-0000-0000-0000-000000000004), '
          'GPU 5') in result.stderr
  log = (tmp_path / 'logs' / 'rank_1.log').read_text()
  assert 'GPU host: this process drives GPU 4' in log
  assert 'local_device_ids [0, 1, 2, 3]; preallocates 90% of each' in log
  run = helpers.read_json(tmp_path / 'run.json')
  # The podrun that ran it, in run.json and summary.json alike.
  assert run['podrun_version'].startswith('0.2.')
  assert helpers.read_json(
      tmp_path / 'summary.json')['podrun_version'] == run['podrun_version']
  gpu = run['gpu']
  assert [g['index'] for g in gpu['gpus']] == [0, 1, 2, 3]
  assert gpu['memory_fraction'] == 0.9
  assert gpu['variables'] == {
      'XLA_CLIENT_MEM_FRACTION': '0.9',
      'XLA_FLAGS': '--xla_gpu_enable_latency_hiding_scheduler=true',
      'CUDA_DEVICE_MAX_CONNECTIONS': '1'
  }


def test_16_processes_on_8_gpus_are_refused_before_start(tmp_path):
  result = _launch(tmp_path, '--local_processes=16', timeout=60)
  assert result.returncode == 2, result.output
  assert ('--local_processes=16 on a host of 8 GPU(s): more processes than '
          'GPUs would put two on one GPU') in result.stderr
  assert not (tmp_path / 'logs' / 'rank_0.log').exists()
  # Emulated CPU devices are still there for the asking.
  dry = _launch(tmp_path, '--local_processes=16', '--local_devices=1',
                '--dry_run')
  assert dry.returncode == 0 and 'CUDA_VISIBLE_DEVICES' not in dry.stdout
