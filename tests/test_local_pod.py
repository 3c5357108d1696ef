"""A pod of processes on 127.0.0.1: real cross-process collectives."""

import os

import numpy as np
import pytest

from configs import linear_regression as linear_regression_config
from runtime import data
from runtime.common import layout
from runtime.workloads import linear_regression
from tests import helpers
from tests.reference import single_device_descent

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

LINEAR = 'configs/linear_regression.py'
STEPS = '--config.steps=60'


def _pod(tmp_path, name, processes, devices, *extra):
  workdir = tmp_path / name
  result = helpers.run_launcher([
      f'--config={LINEAR}', f'--workdir={workdir}', STEPS,
      f'--local_processes={processes}', f'--local_devices={devices}', *extra
  ])
  assert result.returncode == 0, result.output
  return workdir, result


def _rank_fingerprints(workdir, processes):
  return [
      helpers.read_json(workdir / 'ranks' / f'rank_{i}.json')['fingerprint']
      for i in range(processes)
  ]


def _assert_layout(workdir, processes):
  """Every name at the top of the workdir is the layout's, and each
  process's files are read back by its index (tests/test_layout.py)."""
  assert set(os.listdir(workdir)) <= set(layout.TOP_LEVEL), os.listdir(workdir)
  record = layout.Record(str(workdir))
  indices = list(range(processes))
  assert list(layout.ranks(os.path.dirname(record.result(0)))) == indices
  assert list(layout.ranks(record.logs(), '.log')) == indices
  (attempt, ledgers), = record.attempts_with_ledgers().items()
  assert list(ledgers) == indices
  assert helpers.read_json(ledgers[1])['notes']['attempt'] == attempt
  for path in (record.summary(), record.rollup(), record.metrics(),
               record.attempts(), record.job()):
    assert os.path.exists(path), path


def test_pods_agree_with_one_process_and_with_one_device(tmp_path):
  """About 30 s (36 s in the loaded suite): three launches, a 1x8 run and
  the 2x4 and 4x2 pods (six processes), which must equal it and one
  device's descent; the one test of both pod shapes against both."""
  single = tmp_path / 'single'
  result = helpers.run_launcher(
      [f'--config={LINEAR}', f'--workdir={single}', STEPS, '--local_devices=8'])
  assert result.returncode == 0, result.output
  expected = helpers.read_json(single / 'summary.json')['results']

  config = linear_regression_config.get_config()
  config.steps = 60
  task, _ = linear_regression.make_task(config)
  reference = single_device_descent(config, task)

  for processes, devices in ((2, 4), (4, 2)):
    workdir, _ = _pod(tmp_path, f'pod{processes}x{devices}', processes, devices)
    summary = helpers.read_json(workdir / 'summary.json')
    assert (summary['process_count'], summary['device_count'],
            summary['local_device_count']) == (processes, 8, devices)
    _assert_layout(workdir, processes)
    prints = _rank_fingerprints(workdir, processes)
    # Every process ends with bit-identical parameters.
    assert len({p['sha256'] for p in prints}) == 1, prints
    got = summary['results']
    for key in ('learned_weight', 'learned_bias'):
      np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got['learned_weight'],
                               reference['weight'],
                               rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(got['learned_bias'],
                               reference['bias'],
                               rtol=1e-5,
                               atol=1e-6)


def test_each_global_batch_is_split_exactly_once_across_processes(tmp_path):
  workdir = tmp_path / 'ids'
  result = helpers.run_launcher([
      f'--config={helpers.PROBE_CONFIG}', f'--workdir={workdir}',
      '--local_processes=2', '--local_devices=4', '--config.record_ids=True',
      '--config.steps=40', '--config.data.num_examples=1000'
  ])
  assert result.returncode == 0, result.output
  seen = [np.load(workdir / 'ids' / f'rank_{i}.npy') for i in range(2)]
  assert seen[0].shape == seen[1].shape == (40, 128)
  for step in range(40):  # Ten epoch boundaries among them.
    both = np.concatenate([seen[0][step], seen[1][step]])
    assert len(set(both.tolist())) == 256
    np.testing.assert_array_equal(
        both, data.global_batch_ids(step, 256, 1000, seed=0))
  # 40 steps x 256 = 10 epochs and a quarter of 1000 examples: every example
  # is seen 10 or 11 times, none dropped, none favoured.
  counts = np.bincount(np.concatenate(seen).ravel(), minlength=1000)
  assert set(counts.tolist()) == {10, 11} and counts.sum() == 40 * 256


def test_console_shows_rank_zero_and_other_ranks_warnings(tmp_path):
  _, result = _pod(tmp_path, 'console', 2, 4)
  assert '[rank 0/2] ' in result.stderr and 'step 60/60' in result.stderr
  # Rank 1's INFO lines are in its log file, not on the console.
  assert not any(
      l.startswith('[rank 1/2] I') for l in result.stderr.splitlines())
  log = (tmp_path / 'console' / 'logs' / 'rank_1.log').read_text()
  assert 'jax.distributed.initialize(' in log
  assert '[launcher] all 2 ranks finished' in result.stderr


def test_dry_run_prints_every_rank_and_starts_nothing(tmp_path):
  workdir = tmp_path / 'dry'
  result = helpers.run_launcher([
      f'--config={LINEAR}', f'--workdir={workdir}', '--local_processes=2',
      '--coordinator_address=127.0.0.1:23456', '--dry_run'
  ],
                                timeout=60)
  assert result.returncode == 0, result.output
  lines = [l for l in result.stdout.splitlines() if l.startswith('rank ')]
  assert len(lines) == 2
  for i, line in enumerate(lines):
    assert line.startswith(f'rank {i}/2: cd ')
    for part in ('PODRUN_SUPERVISED=1', '-m launcher', f'--config={LINEAR}',
                 '--coordinator_address=127.0.0.1:23456',
                 '--coordinator_bind_address=127.0.0.1:23456',
                 '--num_processes=2', f'--process_id={i}', '--local_devices=4',
                 f'--workdir={workdir}'):
      assert part in line, (part, line)
    assert '--local_processes' not in line and '--dry_run' not in line
  assert not workdir.exists()


def test_a_local_pod_refuses_a_non_loopback_coordinator(tmp_path):
  result = helpers.run_launcher([
      f'--config={LINEAR}', f'--workdir={tmp_path}', '--local_processes=2',
      '--coordinator_address=10.0.0.1:1234', '--dry_run'
  ],
                                timeout=60)
  assert result.returncode == 2
  assert 'loopback only' in result.stderr
