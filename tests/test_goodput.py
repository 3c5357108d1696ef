"""The goodput ledger: every second of a job accounted for, across attempts."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from runtime.common import goodput
from runtime.common import time_to_recover
from tests import helpers

pytestmark = pytest.mark.unit


PROBE = f'--config={helpers.PROBE_CONFIG}'


def _ledger(path, started, updated, final, **parts):
  path.parent.mkdir(parents=True, exist_ok=True)
  full = {p: 0.0 for p in goodput.PROCESS_PARTS}
  full.update(parts)
  full['other'] = updated - started - sum(v for k, v in full.items()
                                          if k != 'other')
  path.write_text(json.dumps({'started': started, 'updated': updated,
                              'final': final, 'parts': full,
                              'notes': {'last_step': 10}}))


def test_rollup_accounts_for_every_second(tmp_path):
  # Attempt a1: 100-110 s, killed (its ledger stops at 108, the launcher
  # saw it end at 110); 3 s of back-off; attempt a2: 113.5-130, clean.
  _ledger(tmp_path / 'goodput' / 'a1' / 'rank_0.json', 100.5, 108, False,
          startup=1, productive=5)
  _ledger(tmp_path / 'goodput' / 'a2' / 'rank_0.json', 113.5, 129.5, True,
          startup=1, compile=2, recomputed=1, productive=10)
  (tmp_path / 'logs').mkdir()
  (tmp_path / 'logs' / 'attempts.jsonl').write_text(
      json.dumps({'name': 'a1', 'started': 100, 'ended': 110, 'exit_code': 137,
                  'launcher_started': 99.5}) + '\n' +
      json.dumps({'name': 'a2', 'started': 113, 'ended': 130, 'exit_code': 0,
                  'launcher_started': 99.5}) + '\n')
  result = goodput.rollup(str(tmp_path))
  assert result['wall_s'] == pytest.approx(130 - 99.5)
  assert sum(result['parts'].values()) == pytest.approx(result['wall_s'])
  a1, a2 = result['attempts']
  assert a1['parts']['unrecorded'] == pytest.approx(2.0)  # 108 -> 110.
  assert a2['parts']['restart_backoff'] == pytest.approx(3.0)  # 110 -> 113.
  assert a1['parts']['launch_overhead'] == pytest.approx(0.5 + 0.5)
  assert result['parts']['productive'] == 15
  assert result['goodput'] == pytest.approx(15 / 30.5)


def _attempt_lines(log: str) -> list[str]:
  return log.split('===== attempt 2 =====')


@pytest.mark.processes
def test_a_restart_is_accounted_for_and_recomputed_steps_counted(tmp_path):
  # Rank 1 fails with a retryable 7 while step 13 is loaded; the restart
  # resumes from the checkpoint of step 10 and trains again what attempt 1
  # had trained past it.
  started = time.time()
  result = helpers.run_launcher(
      [PROBE, f'--workdir={tmp_path}', '--local_processes=2',
       '--config.steps=30', '--config.log_every=1',
       '--config.checkpoint_every=5', '--config.fail_rank=1',
       '--config.fail_step=12', '--config.fail_code=7',
       '--config.fail_once=True', '--retry_exit_codes=7',
       '--max_restarts=1', '--restart_backoff=5'], timeout=180)
  wall = time.time() - started
  assert result.returncode == 0, result.output
  rollup = helpers.read_json(tmp_path / 'summary.json')['goodput']
  assert rollup['attempts'] == 2
  assert abs(sum(rollup['parts'].values()) - rollup['wall_s']) < 1e-6
  assert abs(rollup['wall_s'] - wall) < 0.01 * wall, (rollup['wall_s'], wall)
  # The first restart is at once: --restart_backoff=5 starts at the second.
  assert rollup['parts']['restart_backoff'] < 4
  attempts = [json.loads(l) for l in
              (tmp_path / 'goodput.jsonl').read_text().splitlines()]
  first_log, second_log = _attempt_lines(
      (tmp_path / 'logs' / 'rank_0.log').read_text())
  trained = max(int(s) for s in re.findall(r'step (\d+)/30 ', first_log))
  resumed = int(re.search(r'resuming at step (\d+)', second_log).group(1))
  assert resumed == 10 and trained > resumed
  assert attempts[0]['notes']['last_step'] == trained
  # Recomputed: exactly the steps after 10 that attempt 1 had completed.
  assert attempts[1]['notes']['recomputed_steps'] == trained - resumed
  assert attempts[1]['parts']['recomputed'] > 0
  # The second attempt found attempt 1's compilations in the cache.
  assert attempts[1]['notes'].get('compile_cache_hits', 0) > 0
  assert attempts[1]['parts']['compile'] < attempts[0]['parts']['compile']
  per_rank = attempts[1]['ranks']
  assert sorted(per_rank) == ['0', '1']


@pytest.mark.processes
def test_a_sigkilled_attempt_is_counted_as_lost_not_dropped(tmp_path):
  proc = helpers.start_launcher(
      [PROBE, f'--workdir={tmp_path}', '--local_processes=2',
       '--config.steps=200', '--config.log_every=1',
       '--config.checkpoint_every=5', '--max_restarts=1',
       '--retry_exit_codes=137', '--heartbeat_timeout=3',
       # Rank 0 pauses at step 25, whatever the machine's speed: the kill
       # lands mid-run, seconds after the ledger's last write.
       '--config.fail_rank=0', '--config.fail_step=25',
       '--config.fail_mode=sleep', '--config.fail_seconds=8',
       '--config.fail_once=True'])
  started = time.monotonic()
  try:
    assert helpers.wait_for(
        lambda: (tmp_path / 'logs' / 'rank_0.log').exists() and
        'step 20/' in (tmp_path / 'logs' / 'rank_0.log').read_text(), 90)
    time.sleep(3)  # Past the ledger's last write: some seconds unrecorded.
    os.kill(helpers.rank_pids(tmp_path)[0], signal.SIGKILL)
    result = helpers.finish(proc, 150, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 0, result.output
  attempts = [json.loads(l) for l in
              (tmp_path / 'goodput.jsonl').read_text().splitlines()]
  assert [a['final'] for a in attempts] == [False, True]
  assert attempts[0]['exit_code'] == 128 + signal.SIGKILL
  assert attempts[0]['parts']['unrecorded'] > 0
  rollup = helpers.read_json(tmp_path / 'summary.json')['goodput']
  assert abs(sum(rollup['parts'].values()) - rollup['wall_s']) < 1e-6


def test_goodput_script_prints_and_draws(tmp_path):
  _ledger(tmp_path / 'goodput' / 'a1' / 'rank_0.json', 0, 10, True,
          startup=1, productive=8)
  _ledger(tmp_path / 'goodput' / 'a1' / 'rank_1.json', 0, 10, True,
          startup=2, productive=7)
  out = subprocess.run(
      [sys.executable, str(helpers.REPO / 'scripts' / 'goodput.py'),
       str(tmp_path)], capture_output=True, text=True, timeout=120,
      check=False)
  assert out.returncode == 0, out.stderr
  assert 'goodput 0.800' in out.stdout
  assert 'a1 rank 1' in out.stdout
  assert (tmp_path / 'goodput.png').stat().st_size > 1000


@pytest.mark.processes
def test_the_high_water_mark_survives_sigkill(tmp_path):
  path = tmp_path / 'goodput' / 'a1' / 'rank_1.step'
  helpers.run_then_sigkill(
      'import os\nfrom runtime.common import goodput\n'
      f'mark = goodput.HighWater({str(path)!r})\n'
      'for step in range(1, 74):\n'
      '  mark.write(step)')
  assert goodput.HighWater.read(str(path)) == 73
  ledger = goodput.Ledger()
  ledger.path = str(tmp_path / 'goodput' / 'a2' / 'rank_0.json')
  # Any process's furthest step of any earlier attempt.
  assert goodput.steps_done_before(ledger) == 73


def test_time_to_recover_is_split_into_phases():
  fault = {'at': 100.0, 'detected': 100.2, 'rank': 1}
  before = {0: {'started': 50.0, 'updated': 100.5, 'final': False,
                'parts': {}, 'notes': {}}}
  ledger_0 = {'started': 102.0, 'updated': 130.0, 'final': True, 'parts': {},
           'notes': {'restore_tier': 'peer', 'restore_step': 440,
                     'recomputed_steps': 7, 'first_productive': {
                         'wall': 105.0, 'step': 448, 'parts': {
                             'startup': 1.0, 'distributed_init': 0.2,
                             'checkpoint_restore': 0.3, 'compile': 0.4,
                             'recomputed': 0.5}}}}
  launch_before = {'started': 49.0, 'ended': 101.0, 'fault': fault}
  launch = {'started': 101.5, 'ended': 131.0}
  found = time_to_recover.phases(before, launch_before, 101.0, ledger_0,
                                  launch)
  assert found['total_s'] == pytest.approx(5.0)
  assert found['phases'] == pytest.approx({
      'detection': 0.2, 'teardown': 0.8, 'backoff': 0.5,
      'startup': 1.5, 'distributed_init': 0.2, 'restore': 0.3,
      'compile': 0.4, 'recomputed': 0.5, 'other': 0.6})
  assert (found['restore_tier'], found['recomputed_steps']) == ('peer', 7)


def test_without_a_launcher_the_supervisors_notice_is_the_fault():
  ranks = {0: {'notes': {'fault': {'at': 10.0, 'detected': 25.0}}},
           1: {'notes': {'fault': {'at': 10.0, 'detected': 24.0}}}}
  assert time_to_recover.fault_of(ranks, None) == {'at': 10.0, 'detected': 24.0}
  assert time_to_recover.fault_of({0: {'notes': {}}}, {'fault': None}) is None


def test_a_restart_at_once_never_counts_a_second_twice(tmp_path):
  # a2's process start, read from /proc in clock ticks, falls 5 ms before
  # a1's end: the overlap comes out of its start-up, not twice into the job.
  _ledger(tmp_path / 'goodput' / 'a1' / 'rank_0.json', 100.5, 110, True,
          startup=1, productive=5)
  _ledger(tmp_path / 'goodput' / 'a2' / 'rank_0.json', 109.995, 120, True,
          startup=1, productive=8)
  (tmp_path / 'logs').mkdir()
  (tmp_path / 'logs' / 'attempts.jsonl').write_text(
      json.dumps({'name': 'a1', 'started': 100, 'ended': 110, 'exit_code': 137,
                  'launcher_started': 100}) + '\n' +
      json.dumps({'name': 'a2', 'started': 110.001, 'ended': 120,
                  'exit_code': 0, 'launcher_started': 100}) + '\n')
  result = goodput.rollup(str(tmp_path))
  assert sum(result['parts'].values()) == pytest.approx(result['wall_s'],
                                                        abs=1e-9)
  assert result['parts']['restart_backoff'] == 0
  assert result['attempts'][1]['parts']['startup'] == pytest.approx(0.995)
