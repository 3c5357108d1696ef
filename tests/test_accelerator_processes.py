"""The accelerator tier: podrun on a real chip, as it comes.

Every test here is skipped where JAX, started as the launcher starts it,
sees no accelerator (CI's machines, a laptop). Where a TPU or GPU is at hand
(`scripts/test.sh -m accelerator -p no:xdist`: one program at a time holds a
TPU), it runs the front door, a short job of each built-in workload, a
checkpoint saved and restored, a preemption notice, and the chip benchmark's
tiny shape. BUILD_NOTES.md records each run: the chip, JAX, the date.
"""

import signal
import subprocess
import sys
import time

import pytest

from runtime.common import exit_codes
from tests import helpers
from tests import test_benchmark_chip_processes

pytestmark = [
    pytest.mark.processes, pytest.mark.accelerator,
    pytest.mark.timeout(600)
]


@pytest.fixture(scope='module', autouse=True)
def platform() -> str:
  """The platform JAX picks in a process started as the launcher is."""
  result = subprocess.run(
      [sys.executable, '-c', 'import jax; print(jax.default_backend())'],
      env=helpers.launcher_env(),
      capture_output=True,
      text=True,
      timeout=120,
      check=False)
  found = result.stdout.strip().splitlines()[-1:] or ['?']
  if result.returncode != 0 or found[0] == 'cpu':
    pytest.skip(f'no accelerator: JAX picks {found[0]}')
  return found[0]


def _job(workdir, *args, timeout=300):
  result = helpers.run_launcher([f'--workdir={workdir}', *args],
                                timeout=timeout)
  assert result.returncode == 0, result.output[-4000:]
  return result


def test_the_default_job_runs_on_the_chip_as_it_comes(tmp_path, platform):
  # What scripts/run.sh runs: no flags but the config.
  result = _job(tmp_path, '--config=configs/linear_regression.py')
  assert "one process on all of this host's devices" in result.stderr
  summary = helpers.read_json(tmp_path / 'summary.json')
  assert summary['process_count'] == 1
  assert summary['device_kind'] != 'cpu'
  assert f'{platform} devices' in helpers.first_line_with(
      result.stderr, 'topology:')


def _mnist_data(tmp_path) -> str:
  from runtime.workloads import mnist  # pylint: disable=g-import-not-at-top
  data = tmp_path / 'mnist'
  mnist.write_synthetic(str(data), num_train=2048, num_test=512)
  return str(data)


@pytest.mark.parametrize('config', [
    'linear_regression', 'mlp', 'dot_product', 'mnist', 'mnist_cnn', 'decoder'
])
def test_each_built_in_workload_runs_a_short_job(tmp_path, config):
  """18-50 s on a TPU v5e: the TPU runtime's start-up, a compilation (the
  decoder's at GPT-2 small's shape), 30 steps."""
  args = [
      f'--config=configs/{config}.py', '--config.steps=30',
      '--config.log_every=10'
  ]
  if config.startswith('mnist'):
    args += [
        f'--config.data_dir={_mnist_data(tmp_path)}', '--config.eval_every=0'
    ]
  result = _job(tmp_path / 'job', *args)
  if config == 'dot_product':  # It checks pmap(vmap(dot)); it trains nothing.
    assert helpers.read_json(tmp_path / 'job' / 'summary.json')['results']
    return
  records = helpers.read_jsonl(tmp_path / 'job' / 'metrics.jsonl')
  timed = [r for r in records if 'steps_per_sec' in r]
  assert timed and timed[-1]['step'] == 30, records
  assert all(r['tflops_per_device'] > 0 for r in timed)
  if config == 'decoder':
    # The chip's peak is known: MFU on the step line, tokens too.
    assert 'mfu=' in result.stderr and 'tokens_per_sec=' in result.stderr
    assert all(0 < r['mfu'] < 1 for r in timed[1:])


def test_a_checkpoint_is_saved_and_restored_on_the_chip(tmp_path):
  """About 66 s on a TPU v5e: three jobs, each starting the TPU runtime."""
  mlp = [
      '--config=configs/mlp.py', '--config.checkpoint_every=10',
      '--config.log_every=5'
  ]
  _job(tmp_path / 'straight', *mlp, '--config.steps=30')
  _job(tmp_path / 'resumed', *mlp, '--config.steps=20')
  again = _job(tmp_path / 'resumed', *mlp, '--config.steps=30')
  assert 'resuming at step 20' in again.stderr
  assert (helpers.fingerprints(tmp_path / 'resumed', 1) == helpers.fingerprints(
      tmp_path / 'straight', 1))


def test_a_preemption_notice_saves_and_the_job_resumes(tmp_path):
  """About 30 s on a TPU v5e: the job, its notice, and the job again."""
  probe = [
      f'--config={helpers.PROBE_CONFIG}', '--config.log_every=1',
      '--config.checkpoint_every=10', '--config.steps=40',
      f'--workdir={tmp_path}'
  ]
  # Process 0 pauses in the batch of step 20: the notice lands mid-run.
  pause = [
      '--config.fail_rank=0', '--config.fail_step=20',
      '--config.fail_mode=sleep', '--config.fail_seconds=6'
  ]
  proc = helpers.start_launcher([*probe, *pause])
  started = time.monotonic()
  try:
    assert helpers.wait_for(
        lambda: proc.poll() is not None or _reached(tmp_path, 15), 240)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    result = helpers.finish(proc, 240, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == exit_codes.PREEMPTED, result.output[-4000:]
  assert 'preempted: saved the checkpoint of step' in result.stderr
  again = helpers.run_launcher(probe, timeout=300)
  assert again.returncode == 0, again.output[-4000:]
  steps = [r['step'] for r in helpers.read_jsonl(tmp_path / 'metrics.jsonl')]
  assert steps == list(range(1, 41))


def _reached(workdir, step: int) -> bool:
  try:
    return any(r['step'] >= step
               for r in helpers.read_jsonl(workdir / 'metrics.jsonl'))
  except (OSError, ValueError):
    return False


def test_the_chip_benchmark_at_its_tiny_shape(tmp_path):
  """About 72 s on a TPU v5e: two one-step jobs in fresh processes, then
  two workloads four ways each."""
  _, figures = test_benchmark_chip_processes.run_tiny(tmp_path,
                                                      steps=10,
                                                      mnist_steps=30)
  assert figures['platform'] != 'cpu'
  assert figures['lm']['mfu']['hand'] > 0


def test_a_sigkill_resumes_from_the_local_copy_on_the_chip(tmp_path):
  # The fault benchmark's tiny shape on the chip: killed at a step in [60,
  # 80], started again; the same assertions as on a CPU (every second of
  # the restart named, the local copy restored).
  test_benchmark_chip_processes.test_the_fault_benchmark_names_every_second_of_a_restart(
      tmp_path)
