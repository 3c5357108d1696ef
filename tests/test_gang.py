"""Gang failure handling of a local pod: one failure ends the whole job fast,
names its cause, and leaves no process behind."""

import os
import signal
import socket
import threading
import time

import pytest

from runtime.common import exit_codes
from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]

PROBE = f'--config={helpers.PROBE_CONFIG}'
LONG = '--config.steps=1000000'
OWN_LOOP = '--config=tests/workloads/own_loop_config.py'


def _wait_until_stepping(workdir, proc):
  metrics = workdir / 'metrics.jsonl'
  assert helpers.wait_for(
      lambda: metrics.exists() and metrics.stat().st_size > 0 or proc.poll() is
      not None, 90)
  assert proc.poll() is None, proc.communicate()


def test_a_rank_that_exits_7_ends_the_job_with_7(tmp_path):
  result = helpers.run_launcher([
      PROBE, f'--workdir={tmp_path}', '--local_processes=2', LONG,
      '--config.fail_rank=1', '--config.fail_step=3', '--config.fail_mode=exit',
      '--config.fail_code=7'
  ])
  assert result.returncode == 7, result.output
  assert 'rank 1/2 failed first, with exit code 7' in result.stderr
  # Rank 0 stops, by itself (exit 10) or by the launcher, whichever is first.
  rank_0 = helpers.first_line_with(result.stderr, '[launcher] rank 0/2:')
  assert "a consequence of rank 1/2's failure, not a cause" in rank_0, rank_0
  # JAX alone would notice only after its 100 s heartbeat timeout.
  assert result.elapsed < 60
  helpers.assert_no_survivors(tmp_path)


def test_a_rank_that_raises(tmp_path):
  result = helpers.run_launcher([
      PROBE, f'--workdir={tmp_path}', '--local_processes=2', LONG,
      '--config.fail_rank=1', '--config.fail_mode=raise'
  ])
  assert result.returncode == exit_codes.FAILED, result.output
  assert 'rank 1/2 failed first, with exit code 1' in result.stderr
  # Rank 1's traceback is on the console and in the tail of its log.
  assert '[rank 1/2] RuntimeError: probe: rank 1 raises on purpose' in (
      result.stderr)
  assert '  | RuntimeError: probe: rank 1 raises on purpose' in result.stderr
  helpers.assert_no_survivors(tmp_path)


def test_a_rank_killed_from_outside(tmp_path):
  proc = helpers.start_launcher(
      [PROBE, f'--workdir={tmp_path}', '--local_processes=2', LONG])
  started = time.monotonic()
  try:
    _wait_until_stepping(tmp_path, proc)
    os.kill(helpers.rank_pids(tmp_path)[1], signal.SIGKILL)
    result = helpers.finish(proc, 60, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 128 + signal.SIGKILL, result.output
  assert 'rank 1/2 failed first, with exit code 137 (SIGKILL)' in result.stderr
  helpers.assert_no_survivors(tmp_path)


def test_sigint_to_the_launcher_stops_every_rank(tmp_path):
  # SIGTERM is a preemption notice instead: see test_preemption.py.
  signum = signal.SIGINT
  proc = helpers.start_launcher(
      [PROBE, f'--workdir={tmp_path}', '--local_processes=2', LONG])
  started = time.monotonic()
  try:
    _wait_until_stepping(tmp_path, proc)
    proc.send_signal(signum)
    result = helpers.finish(proc, 60, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 128 + signum, result.output
  name = signal.Signals(signum).name
  assert f'got {name}: forwarded it to every rank' in result.stderr
  for rank in (0, 1):
    assert f'rank {rank}/2: stopped by the launcher' in result.stderr
  helpers.assert_no_survivors(tmp_path)


def test_the_watchdog_ends_a_stalled_job_with_stacks_in_the_logs(tmp_path):
  result = helpers.run_launcher([
      PROBE, f'--workdir={tmp_path}', '--local_processes=2', LONG,
      '--config.fail_rank=1', '--config.fail_step=3', '--config.fail_mode=hang',
      '--stall_timeout=5'
  ])
  assert result.returncode == exit_codes.STALLED, result.output
  # The ranks' own watchdogs fire first; the launcher reports it.
  assert 'the job stalled: the hang watchdog of rank' in result.stderr
  hung = (tmp_path / 'logs' / 'rank_1.log').read_text()
  waiting = (tmp_path / 'logs' / 'rank_0.log').read_text()
  assert 'most recent call first' in hung and '_misbehave' in hung
  assert 'most recent call first' in waiting
  assert 'laggards: rank 1 on' in waiting
  helpers.assert_no_survivors(tmp_path)


def test_the_launchers_watchdog_is_a_backstop(tmp_path):
  # Without the ranks' own supervision the launcher's watchdog fires,
  # 15 s after --stall_timeout.
  result = helpers.run_launcher([
      PROBE, f'--workdir={tmp_path}', '--local_processes=2', LONG,
      '--config.fail_rank=1', '--config.fail_step=3', '--config.fail_mode=hang',
      '--stall_timeout=2', '--nosupervision'
  ])
  assert result.returncode == exit_codes.STALLED, result.output
  assert 'the job stalled: no rank completed a step for' in result.stderr
  assert "the ranks' own watchdogs did not end them 15 s later" in (
      result.stderr)
  hung = (tmp_path / 'logs' / 'rank_1.log').read_text()
  assert 'most recent call first' in hung and '_misbehave' in hung
  helpers.assert_no_survivors(tmp_path)


def test_a_slow_first_step_is_not_a_stall(tmp_path):
  # The stall clock starts at the first completed step: a start-up or a
  # compilation longer than --stall_timeout must not trip it.
  result = helpers.run_launcher([
      PROBE, f'--workdir={tmp_path}', '--local_processes=2', '--config.steps=3',
      '--config.fail_rank=0', '--config.fail_step=0',
      '--config.fail_mode=sleep', '--config.fail_seconds=6', '--stall_timeout=4'
  ])
  assert result.returncode == 0, result.output


def test_first_step_timeout(tmp_path):
  result = helpers.run_launcher([
      PROBE, f'--workdir={tmp_path}', '--local_processes=2', LONG,
      '--config.fail_rank=0', '--config.fail_step=0', '--config.fail_mode=hang',
      '--first_step_timeout=8'
  ])
  assert result.returncode == exit_codes.STALLED, result.output
  assert 'the job stalled: the hang watchdog of rank' in result.stderr
  assert 'no first step completed within 8 s (--first_step_timeout)' in (
      result.stderr)
  helpers.assert_no_survivors(tmp_path)


def test_a_single_process_has_its_watchdog_too(tmp_path):
  result = helpers.run_launcher([
      PROBE, f'--workdir={tmp_path}', LONG, '--config.fail_rank=0',
      '--config.fail_step=0', '--config.fail_mode=hang',
      '--first_step_timeout=4'
  ])
  assert result.returncode == exit_codes.STALLED, result.output
  assert 'no first step completed within 4 s' in result.stderr
  assert 'most recent call first' in result.stderr and '_misbehave' in (
      result.stderr)


def test_coordinator_port_in_use(tmp_path):
  # Held for good: process 0 waits half --initialization_timeout.
  with socket.socket() as holder:
    holder.bind(('127.0.0.1', 0))
    holder.listen()
    port = holder.getsockname()[1]
    result = helpers.run_launcher([
        '--config=configs/linear_regression.py', f'--workdir={tmp_path}',
        '--local_processes=2', f'--coordinator_address=127.0.0.1:{port}',
        '--initialization_timeout=8'
    ],
                                  timeout=90)
  assert result.returncode == exit_codes.DISTRIBUTED_INIT_FAILED, result.output
  assert (f'the coordinator port {port} on 127.0.0.1 is still in use after '
          '4 s') in result.stderr
  helpers.assert_no_survivors(tmp_path)


def test_a_coordinator_port_let_go_soon_is_waited_for(tmp_path):
  # As an earlier attempt's coordinator that is still exiting.
  holder = socket.create_server(('127.0.0.1', 0))
  port = holder.getsockname()[1]
  # Let go once process 0 says it waits (or after 30 s), so that a slow
  # start cannot find the port free already.
  said = lambda: f'coordinator port {port} is in use' in ''.join(
      p.read_text(errors='replace') for p in tmp_path.glob('logs/rank_0*'))
  threading.Thread(target=lambda: (helpers.wait_for(said, 30), holder.close()),
                   daemon=True).start()
  result = helpers.run_launcher([
      '--config=configs/linear_regression.py', f'--workdir={tmp_path}',
      '--config.steps=5', '--local_processes=2',
      f'--coordinator_address=127.0.0.1:{port}'
  ],
                                timeout=90)
  assert result.returncode == 0, result.output
  assert f'the coordinator port {port} is in use' in result.stderr


def test_nobody_listens_at_the_coordinator_address(tmp_path):
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]  # Free once closed; nothing listens there.
  result = helpers.run_launcher([
      '--config=configs/linear_regression.py', f'--workdir={tmp_path}',
      f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
      '--process_id=1', '--initialization_timeout=3'
  ],
                                timeout=60)
  assert result.returncode == exit_codes.DISTRIBUTED_INIT_FAILED, result.output
  assert f'no coordinator answered at 127.0.0.1:{port} within 3 s' in (
      result.stderr)


def test_topology_mismatch_names_the_numbers(tmp_path):
  result = helpers.run_launcher([
      '--config=configs/linear_regression.py', f'--workdir={tmp_path}',
      '--local_processes=2', '--config.topology.num_processes=4'
  ],
                                timeout=90)
  assert result.returncode == exit_codes.TOPOLOGY_MISMATCH, result.output
  assert 'config.topology.num_processes=4 but --local_processes=2' in (
      result.stderr)
  helpers.assert_no_survivors(tmp_path)


def test_topology_mismatch_found_after_initialisation(tmp_path):
  result = helpers.run_launcher([
      '--config=configs/linear_regression.py', f'--workdir={tmp_path}',
      '--local_processes=2', '--local_devices=2',
      '--config.topology.platform=tpu'
  ],
                                timeout=90)
  assert result.returncode == exit_codes.TOPOLOGY_MISMATCH, result.output
  assert 'platform: config.topology.platform expects tpu, but cpu' in (
      result.stderr)
  helpers.assert_no_survivors(tmp_path)


def test_ranks_die_with_a_sigkilled_launcher(tmp_path):
  proc = helpers.start_launcher(
      [PROBE, f'--workdir={tmp_path}', '--local_processes=2', LONG])
  try:
    _wait_until_stepping(tmp_path, proc)
    os.kill(proc.pid, signal.SIGKILL)  # No chance to clean up.
    proc.communicate(timeout=30)
  finally:
    helpers.kill_group(proc)
  helpers.assert_no_survivors(tmp_path)


def test_a_loop_of_its_own_that_reports_progress_is_not_stalled(tmp_path):
  # Ten steps of 0.6 s: 6 s in all, longer than --stall_timeout, each step
  # reported. The first step's clock starts before the processes' set-up
  # and compilation, which a loaded machine may stretch: it gets 60 s.
  result = helpers.run_launcher([
      OWN_LOOP, f'--workdir={tmp_path}', '--local_processes=2',
      '--config.step_seconds=0.6', '--first_step_timeout=60',
      '--stall_timeout=4'
  ])
  assert result.returncode == 0, result.output
  summary = helpers.read_json(tmp_path / 'summary.json')
  assert summary['results'] == {'steps': 10, 'rows_per_step': 16.0}


def test_a_loop_of_its_own_that_does_not_report_is_told_the_call(tmp_path):
  result = helpers.run_launcher([
      OWN_LOOP, f'--workdir={tmp_path}', '--config.report=False',
      '--config.steps=100', '--first_step_timeout=3'
  ])
  assert result.returncode == exit_codes.STALLED, result.output
  assert 'runtime.progress.report(step)' in result.stderr, result.stderr
