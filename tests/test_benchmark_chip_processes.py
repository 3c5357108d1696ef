"""The chip benchmark (tests/benchmarks/benchmark_chip.py) at its tiny shape,
as CI runs it: every method of both workloads measured, the ratios and the
launcher's first step against a hand-written one's. Speed is not asserted:
it belongs to the benchmark's own runs (BUILD_NOTES.md)."""

import json
import re
import subprocess
import sys

import pytest

from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]


def run_tiny(tmp_path, steps: int,
             mnist_steps: int) -> tuple[subprocess.CompletedProcess, dict]:
  """The benchmark at its tiny shape, one round: (the process, its JSON)."""
  out = tmp_path / 'chip.json'
  result = subprocess.run([
      sys.executable, 'tests/benchmarks/benchmark_chip.py', '--shape=tiny',
      '--rounds=1', f'--steps={steps}', f'--mnist_steps={mnist_steps}',
      f'--out={out}'
  ],
                          cwd=helpers.REPO,
                          env=helpers.launcher_env(),
                          capture_output=True,
                          text=True,
                          timeout=500,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result, json.loads(out.read_text())


def test_the_benchmark_runs_at_its_tiny_shape(tmp_path):
  """25-55 s (the more with the suite beside it): two one-step jobs in
  fresh processes, then two workloads five ways each."""
  result, figures = run_tiny(tmp_path, steps=6, mnist_steps=12)
  assert figures['platform'] == 'cpu' and figures['shape'] == 'tiny'
  for workload in ('lm', 'mnist_mlp'):
    measured = figures[workload]
    assert set(measured['steps_per_sec']) == {
        'podrun_pmap', 'podrun_shard_map', 'podrun_pmap_k1', 'hand',
        'on_device', 'resident_scan'
    }
    assert all(rate > 0 for rate in measured['steps_per_sec'].values())
    for ratio in ('hand_vs_on_device', 'podrun_pmap_vs_hand',
                  'podrun_shard_map_vs_hand', 'podrun_pmap_k1_vs_hand',
                  'podrun_pmap_vs_on_device', 'podrun_pmap_vs_resident_scan'):
      assert measured[ratio] > 0
    assert measured['mfu']['hand'] is None  # The CPU's peak is unknown.
  first = figures['first_step']
  assert first['launcher_s'] > 0 and first['hand_s'] > 0
  assert '| lm |' in result.stdout and 'one-step LM job' in result.stdout


def test_the_host_batch_benchmark_times_both_ways(tmp_path):
  """About 10 s: the three ways of a call's batch, on 2 devices."""
  out = tmp_path / 'host_batch.json'
  subprocess.run([
      sys.executable, 'tests/benchmarks/benchmark_host_batch.py', '--devices=2',
      '--calls=8', '--rounds=1', '--steps_per_call=1,4', f'--out={out}'
  ],
                 cwd=helpers.REPO,
                 env=helpers.launcher_env(),
                 capture_output=True,
                 text=True,
                 timeout=200,
                 check=True)
  figures = json.loads(out.read_text())
  assert figures['devices'] == 2
  for k in ('k1', 'k4'):
    assert set(figures[k]['ms_a_call']) == {'stacked', 'one_read', 'on_device'}
    assert figures[k]['one_read_vs_stacked'] > 0
    assert figures[k]['on_device_vs_stacked'] > 0


def test_the_fault_benchmark_names_every_second_of_a_restart(tmp_path):
  """About 20 s: the tiny LM SIGKILLed at a step in [60, 80] and started
  again, then the clean pair. The restart's phases add up to its time to
  the first step with under 0.5 s unnamed; the restore is the local
  copy's, and what is recomputed is at most the interval the cadence chose
  (and said why)."""
  out = tmp_path / 'fault.json'
  result = subprocess.run([
      sys.executable, 'tests/benchmarks/benchmark_chip.py', '--shape=tiny',
      '--mode=fault', '--kills=1', '--kill_steps=60,80', '--fault_steps=120',
      '--clean_steps=80', f'--out={out}'
  ],
                          cwd=helpers.REPO,
                          env=helpers.launcher_env(),
                          capture_output=True,
                          text=True,
                          timeout=400,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
  fault = json.loads(out.read_text())['fault']
  (round_,) = fault['rounds']
  phases = round_['phases']
  assert abs(phases['unnamed']) < 0.5, phases
  assert {
      'startup', 'backend_start', 'workload_import', 'compile',
      'checkpoint_restore'
  } <= set(phases), phases
  assert round_['restore_tier'] == 'local' and round_['restore_step'] >= 25
  chosen = round_['local_interval']
  assert chosen['why'].startswith("Daly's interval") and chosen['seconds'] > 0
  # Polled every 20 ms: a chip's tiny steps (several a call) run past it.
  assert 60 <= round_['kill_step'] < 120
  assert 0 <= round_['recomputed_steps'] < round_['kill_step']
  clean = fault['clean']
  assert abs(clean['defaults']['unnamed_s']) < 0.5, clean['defaults']
  assert clean['loop_defaults_vs_none'] > 0
  assert 'median lost' in result.stdout


def test_the_input_benchmark_trains_the_same_with_workers(tmp_path):
  """About 20 s: heavy records read in the process, by 8 workers and by
  auto's; the same parameters every way (the input wait is the benchmark's
  figure, not asserted: it depends on the machine)."""
  out = tmp_path / 'input.json'
  subprocess.run([
      sys.executable, 'tests/benchmarks/benchmark_input.py', '--steps=20',
      '--workers=8', '--record_ms=2', f'--out={out}'
  ],
                 cwd=helpers.REPO,
                 env=helpers.launcher_env(),
                 capture_output=True,
                 text=True,
                 timeout=300,
                 check=True)
  figures = json.loads(out.read_text())
  assert figures['same_parameters'], figures
  for way in ('in_process', 'with_workers', 'auto'):
    assert 0 <= figures[way]['input_wait_fraction'] <= 1
  # 64 records of 2 ms of waiting a step: 128 ms or more, so 7 workers or
  # more for 20 ms (waits, so the cores do not bound them).
  said = figures['auto']['said']
  chosen = re.match(r'config.data.workers=auto: (\d+) worker', said[0])
  assert chosen and 7 <= int(chosen.group(1)) <= 16, said
