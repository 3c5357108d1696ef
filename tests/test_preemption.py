"""Preemption, restarts and resume across real processes on 127.0.0.1.

Every job here is the probe linear regression (tests/workloads/probe.py).
Where a signal must land mid-run, rank 0 pauses for a few seconds while
loading the batch of step 20 (fail_mode=sleep): the job cannot finish
meanwhile, so the signal arrives mid-run whatever the machine's speed, and
the pause does not change what is computed.
"""

import json
import os
import pathlib
import signal
import time

import numpy as np
import pytest

from runtime.common import exit_codes
from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

STEPS = helpers.STRAIGHT_STEPS
PROBE = [
    f'--config={helpers.PROBE_CONFIG}', '--config.log_every=1',
    '--config.checkpoint_every=10'
]
PAUSE = [
    '--config.fail_rank=0', '--config.fail_step=20', '--config.fail_mode=sleep',
    '--config.fail_seconds=4'
]
POD = ['--local_processes=2', '--local_devices=4']


def _run(workdir, *args, timeout=120):
  result = helpers.run_launcher([*PROBE, f'--workdir={workdir}', *args],
                                timeout=timeout)
  return result


def _records(workdir):
  with open(pathlib.Path(workdir) / 'metrics.jsonl') as f:
    return [json.loads(line) for line in f]


def _attempts(workdir):
  with open(pathlib.Path(workdir) / 'logs' / 'attempts.jsonl') as f:
    return [json.loads(line) for line in f]


def _wait_for_step(workdir, proc, step, timeout=90):
  path = pathlib.Path(workdir) / 'metrics.jsonl'

  def reached():
    if proc.poll() is not None:
      return True
    try:
      return any(r['step'] >= step for r in _records(workdir))
    except (OSError, ValueError):
      return False

  assert helpers.wait_for(reached, timeout, interval=0.05), path
  assert proc.poll() is None, helpers.finish(proc, 10, 0).output


def _signal_mid_run(args, workdir, target, timeout=180):
  """Starts the launcher, signals `target(proc)` at step 15, waits for it."""
  proc = helpers.start_launcher(args)
  started = time.monotonic()
  try:
    _wait_for_step(workdir, proc, 15)
    target(proc)
    return helpers.finish(proc, timeout, started)
  finally:
    helpers.kill_group(proc)


@pytest.fixture
def straight_2x4(probe_2x4_straight):
  return (helpers.fingerprints(probe_2x4_straight,
                               2)[0], _records(probe_2x4_straight))


@pytest.fixture(scope='module')
def straight_1x8(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('straight_1x8')
  result = _run(workdir, f'--config.steps={STEPS}')
  assert result.returncode == 0, result.output
  return helpers.fingerprints(workdir, 1)[0], _records(workdir)


def _assert_same_run(workdir, straight, ranks, loss_rtol=0.0):
  fingerprint, records = straight
  assert helpers.fingerprints(workdir, ranks) == [fingerprint] * ranks
  resumed = _records(workdir)
  assert [r['step'] for r in resumed] == list(range(1, STEPS + 1))
  np.testing.assert_allclose([r['loss'] for r in resumed],
                             [r['loss'] for r in records],
                             rtol=loss_rtol,
                             atol=0)


def test_resume_is_exact_on_2x4(tmp_path, straight_2x4):
  half = _run(tmp_path, *POD, f'--config.steps={STEPS // 2}')
  assert half.returncode == 0, half.output
  rest = _run(tmp_path, *POD, f'--config.steps={STEPS}')
  assert rest.returncode == 0, rest.output
  assert f'resuming at step {STEPS // 2}' in rest.stderr
  _assert_same_run(tmp_path, straight_2x4, 2)


def test_sigterm_to_one_rank_preempts_and_the_restart_resumes(
    tmp_path, straight_2x4):
  result = _signal_mid_run(
      [
          *PROBE, f'--workdir={tmp_path}', *POD, f'--config.steps={STEPS}',
          *PAUSE, '--max_restarts=1', '--restart_backoff=0.5'
      ], tmp_path,
      lambda proc: os.kill(helpers.rank_pids(tmp_path)[1], signal.SIGTERM))
  assert result.returncode == 0, result.output
  attempts = _attempts(tmp_path)
  assert [(a['exit_code'], a['kind']) for a in attempts
         ] == [(exit_codes.PREEMPTED, 'preempted'), (0, 'ok')], attempts
  assert 'preempted by a preemption notice to a rank' in result.stderr
  assert ('after 1 restart(s): 1 preemption(s), 0 retryable failure(s)'
          in result.stderr)
  # Both ranks saved the same agreed step; the second attempt started there.
  log = (tmp_path / 'logs' / 'rank_1.log').read_text()
  saved = {
      int(line.split('saves step ')[1].split()[0])
      for line in log.splitlines()
      if 'every process saves step' in line
  }
  assert len(saved) == 1, log
  assert f'resuming at step {saved.pop()}' in result.stderr
  _assert_same_run(tmp_path, straight_2x4, 2)
  helpers.assert_no_survivors(tmp_path)


def test_sigterm_to_the_launcher_saves_and_is_not_restarted(
    tmp_path, straight_2x4):
  args = [
      *PROBE, f'--workdir={tmp_path}', *POD, f'--config.steps={STEPS}',
      '--max_restarts=2'
  ]
  result = _signal_mid_run(args + PAUSE, tmp_path,
                           lambda proc: proc.send_signal(signal.SIGTERM))
  # Whoever stops the launcher wants it stopped: no restart here.
  assert result.returncode == exit_codes.PREEMPTED, result.output
  assert 'preempted by SIGTERM to the launcher' in result.stderr
  assert len(_attempts(tmp_path)) == 1
  helpers.assert_no_survivors(tmp_path)
  again = helpers.run_launcher(args, timeout=120)
  assert again.returncode == 0, again.output
  _assert_same_run(tmp_path, straight_2x4, 2)


def test_sigterm_to_a_single_process_job(tmp_path, straight_1x8):
  result = _signal_mid_run(
      [*PROBE, f'--workdir={tmp_path}', f'--config.steps={STEPS}', *PAUSE],
      tmp_path, lambda proc: proc.send_signal(signal.SIGTERM))
  assert result.returncode == exit_codes.PREEMPTED, result.output
  assert 'preempted: saved the checkpoint of step' in result.stderr
  again = _run(tmp_path, f'--config.steps={STEPS}')
  assert again.returncode == 0, again.output
  _assert_same_run(tmp_path, straight_1x8, 1)


def test_a_1x8_checkpoint_restores_on_2x4(tmp_path, straight_1x8):
  first = _run(tmp_path, f'--config.steps={STEPS // 2}')
  assert first.returncode == 0, first.output
  rest = _run(tmp_path, *POD, f'--config.steps={STEPS}')
  assert rest.returncode == 0, rest.output
  assert f'resuming at step {STEPS // 2}' in rest.stderr
  # The gradients' pmean over 8 devices rounds alike in one process and in
  # two (same parameters, bit for bit); the logged loss may differ in its
  # last bit.
  _assert_same_run(tmp_path, straight_1x8, 2, loss_rtol=1e-6)


def test_sigkill_during_a_save_falls_back_to_the_last_complete_checkpoint(
    tmp_path):
  # 16 MB of incompressible parameters and a save every 2 steps: a save is
  # in progress nearly all the time.
  big = [
      '--config.ballast_floats=4000000', '--config.checkpoint_every=2',
      '--config.log_every=2'
  ]
  checkpoints = tmp_path / 'checkpoints'

  def partial():
    try:
      names = os.listdir(checkpoints)
    except OSError:
      return []
    return [n for n in names if '.orbax-checkpoint-tmp' in n]

  def complete():
    try:
      return sorted(int(n) for n in os.listdir(checkpoints) if n.isdigit())
    except OSError:
      return []

  proc = helpers.start_launcher(
      [*PROBE, f'--workdir={tmp_path}', *big, '--config.steps=100000'])
  try:
    assert helpers.wait_for(lambda: complete() and partial(),
                            90,
                            interval=0.005), helpers.finish(proc, 10, 0).output
    helpers.kill_group(proc)
    proc.wait(10)
  finally:
    helpers.kill_group(proc)
  torn = partial()
  assert torn, 'the kill did not land during a save'
  torn_step = int(torn[0].split('.')[0])
  last_complete = max(complete())
  assert last_complete < torn_step
  steps = torn_step + 4
  resumed = _run(tmp_path, *big, f'--config.steps={steps}')
  assert resumed.returncode == 0, resumed.output
  assert f'resuming at step {last_complete}' in resumed.stderr
  assert not partial()  # The next start cleared the torn save away.
  straight = _run(tmp_path / 'straight', *big, f'--config.steps={steps}')
  assert straight.returncode == 0, straight.output
  assert (helpers.fingerprints(tmp_path, 1) == helpers.fingerprints(
      tmp_path / 'straight', 1))
  assert [r['step'] for r in _records(tmp_path)] == list(range(2, steps + 1, 2))


def test_a_user_error_is_not_retried(tmp_path):
  result = _run(tmp_path, *POD, '--config.steps=1000', '--max_restarts=3',
                '--config.fail_rank=1', '--config.fail_mode=raise')
  assert result.returncode == exit_codes.FAILED, result.output
  assert [a['kind'] for a in _attempts(tmp_path)] == ['final']
  assert 'restart 1/' not in result.stderr
  assert 'after 0 restart(s)' in result.stderr
  helpers.assert_no_survivors(tmp_path)


def test_a_retryable_exit_code_is_retried_and_counted_apart(tmp_path):
  result = _run(tmp_path, *POD, '--config.steps=1000', '--max_restarts=1',
                '--retry_exit_codes=7', '--restart_backoff=0.1',
                '--config.fail_rank=1', '--config.fail_mode=exit',
                '--config.fail_code=7')
  assert result.returncode == 7, result.output
  assert [(a['exit_code'], a['kind']) for a in _attempts(tmp_path)
         ] == [(7, 'retryable'), (7, 'retryable')]
  assert 'restart 1/1 after retryable exit code 7' in result.stderr
  assert ('after 1 restart(s): 0 preemption(s), 2 retryable failure(s)'
          in result.stderr)


def test_user_error_codes_cannot_be_marked_retryable(tmp_path):
  result = _run(tmp_path, *POD, '--max_restarts=1', '--retry_exit_codes=1')
  assert result.returncode == exit_codes.CONFIG_ERROR, result.output
  assert 'exit code(s) [1] cannot be retried' in result.stderr


def test_max_restarts_needs_a_local_pod(tmp_path):
  result = _run(tmp_path, '--max_restarts=1')
  assert result.returncode == exit_codes.CONFIG_ERROR, result.output
  assert '--max_restarts needs --local_processes' in result.stderr


def test_a_checkpoint_directory_that_is_not_shared_is_refused(tmp_path):
  result = _run(tmp_path, *POD, '--config.per_rank_checkpoint_dir=true')
  assert result.returncode == exit_codes.CHECKPOINT_ERROR, result.output
  assert 'is not shared: process(es) [1] of 2 cannot see the file' in (
      result.stderr)
  helpers.assert_no_survivors(tmp_path)


def _peak_rss_mb(pid: int) -> float:
  with open(f'/proc/{pid}/status') as f:
    line = next(l for l in f if l.startswith('VmHWM:'))
  return int(line.split()[1]) / 1024


def test_a_run_of_10_to_the_12_steps_starts_as_one_of_1000_and_answers_a_notice(
    tmp_path):
  # Nothing is listed up front for the run's length (runtime/dispatch.py
  # cuts each call as it is reached): the first steps come as soon, and
  # with the same memory, as for 1000 steps, and SIGTERM is answered.
  first_s, peak_mb = {}, {}
  for steps in (1000, 10**12):
    workdir = tmp_path / str(steps)
    proc = helpers.start_launcher([
        *PROBE, f'--workdir={workdir}', f'--config.steps={steps}', *PAUSE,
        '--config.fail_seconds=30'
    ])
    started = time.monotonic()
    try:
      _wait_for_step(workdir, proc, 5)
      first_s[steps] = time.monotonic() - started
      peak_mb[steps] = _peak_rss_mb(proc.pid)  # One process: it trains.
      proc.send_signal(signal.SIGTERM)
      result = helpers.finish(proc, 60, started)
    finally:
      helpers.kill_group(proc)
    assert result.returncode == exit_codes.PREEMPTED, result.output
    assert 'preempted: saved the checkpoint of step' in result.stderr
  assert first_s[10**12] < first_s[1000] + 10, first_s
  assert peak_mb[10**12] < 1.1 * peak_mb[1000] + 20, peak_mb
