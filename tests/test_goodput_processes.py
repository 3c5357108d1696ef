"""The goodput ledger of real jobs: restarts, SIGKILLs, the high-water mark."""

import json
import os
import re
import signal
import time

import pytest

from launcher.common import goodput_rollup
from runtime.common import layout
from runtime.common import goodput
from tests import helpers

pytestmark = pytest.mark.processes

PROBE = f'--config={helpers.PROBE_CONFIG}'


def _attempt_lines(log: str) -> list[str]:
  return log.split('===== attempt 2 =====')


def test_a_restart_is_accounted_for_and_recomputed_steps_counted(tmp_path):
  # Rank 1 fails with a retryable 7 while step 13 is loaded; the restart
  # resumes from the checkpoint of step 10 and trains again what attempt 1
  # had trained past it.
  started = time.time()
  result = helpers.run_launcher([
      PROBE, f'--workdir={tmp_path}', '--local_processes=2',
      '--config.steps=30', '--config.log_every=1',
      '--config.checkpoint_every=5', '--config.fail_rank=1',
      '--config.fail_step=12', '--config.fail_code=7',
      '--config.fail_once=True', '--retry_exit_codes=7', '--max_restarts=1',
      '--restart_backoff=5'
  ],
                                timeout=180)
  ended = time.time()
  assert result.returncode == 0, result.output
  rollup = helpers.read_json(tmp_path / 'summary.json')['goodput']
  assert rollup['attempts'] == 2
  assert abs(sum(rollup['parts'].values()) - rollup['wall_s']) < 1e-6
  # The roll-up spans the launcher's life: from its process's start (known
  # to a clock tick, 10 ms) to the end of its last attempt as it saw it,
  # nothing cut out in between. Checked by order, not by a share of the
  # test's wall time, which the machine's load stretches at both ends.
  spans = goodput_rollup.rollup(layout.Record(str(tmp_path)))['attempts']
  launches = [
      json.loads(l)
      for l in (tmp_path / 'logs' / 'attempts.jsonl').read_text().splitlines()
  ]
  assert started - 0.02 <= spans[0]['started'] <= launches[0]['started']
  assert spans[-1]['ended'] == launches[-1]['ended'] <= ended
  assert abs(rollup['wall_s'] -
             (spans[-1]['ended'] - spans[0]['started'])) < 1e-6, (rollup, spans)
  # The first restart is at once: --restart_backoff=5 starts at the second.
  assert rollup['parts']['restart_backoff'] < 4
  attempts = [
      json.loads(l)
      for l in (tmp_path / 'goodput.jsonl').read_text().splitlines()
  ]
  first_log, second_log = _attempt_lines(
      (tmp_path / 'logs' / 'rank_0.log').read_text())
  trained = max(int(s) for s in re.findall(r'step (\d+)/30 ', first_log))
  resumed = int(re.search(r'resuming at step (\d+)', second_log).group(1))
  assert resumed == 10 and trained > resumed
  assert attempts[0]['notes']['last_step'] == trained
  # Recomputed: exactly the steps after 10 that attempt 1 had completed.
  assert attempts[1]['notes']['recomputed_steps'] == trained - resumed
  assert attempts[1]['parts']['recomputed'] > 0
  # Two CPU processes run without the persistent cache (compilation.py
  # says why): the second attempt compiled again, and said so.
  assert not attempts[1]['notes'].get('compile_cache_hits')
  assert attempts[1]['parts']['compile'] > 0
  per_rank = attempts[1]['ranks']
  assert sorted(per_rank) == ['0', '1']


def test_a_sigkilled_attempt_is_counted_as_lost_not_dropped(tmp_path):
  proc = helpers.start_launcher([
      PROBE,
      f'--workdir={tmp_path}',
      '--local_processes=2',
      '--config.steps=200',
      '--config.log_every=1',
      '--config.checkpoint_every=5',
      '--max_restarts=1',
      '--retry_exit_codes=137',
      '--heartbeat_timeout=3',
      # Rank 0 pauses at step 25, whatever the machine's speed: the kill
      # lands mid-run, seconds after the ledger's last write.
      '--config.fail_rank=0',
      '--config.fail_step=25',
      '--config.fail_mode=sleep',
      '--config.fail_seconds=8',
      '--config.fail_once=True'
  ])
  started = time.monotonic()
  try:
    assert helpers.wait_for(
        lambda: (tmp_path / 'logs' / 'rank_0.log').exists() and 'step 20/' in
        (tmp_path / 'logs' / 'rank_0.log').read_text(), 90)
    time.sleep(3)  # Past the ledger's last write: some seconds unrecorded.
    os.kill(helpers.rank_pids(tmp_path)[0], signal.SIGKILL)
    result = helpers.finish(proc, 150, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 0, result.output
  attempts = [
      json.loads(l)
      for l in (tmp_path / 'goodput.jsonl').read_text().splitlines()
  ]
  assert [a['final'] for a in attempts] == [False, True]
  assert attempts[0]['exit_code'] == 128 + signal.SIGKILL
  assert attempts[0]['parts']['unrecorded'] > 0
  rollup = helpers.read_json(tmp_path / 'summary.json')['goodput']
  assert abs(sum(rollup['parts'].values()) - rollup['wall_s']) < 1e-6


def test_a_resume_by_another_command_books_no_backoff(tmp_path):
  # One process in-process, Ctrl-C'd at step 10; 3 s later a 2-process
  # launch resumes it. Nothing ran the job in between: that is neither
  # back-off nor wall time, and goodput stays at most 1.
  proc = helpers.start_launcher([
      PROBE,
      f'--workdir={tmp_path}',
      '--config.steps=40',
      '--config.log_every=1',
      '--config.checkpoint_every=5',
      '--config.fail_rank=0',
      '--config.fail_step=10',
      '--config.fail_mode=sleep',
      '--config.fail_seconds=60',
      # The sleep is on purpose: the stall watchdog's warm-up floor (10 s)
      # must not end the attempt before the Ctrl-C on a loaded machine.
      '--stall_floor=120'
  ])
  started = time.monotonic()
  try:
    assert helpers.wait_for(
        lambda: proc.poll() is None and any(
            goodput.HighWater.read(str(p)) >= 8
            for p in tmp_path.glob('goodput/*/rank_0.step')), 90)
    proc.send_signal(signal.SIGINT)
    first = helpers.finish(proc, 60, started)
  finally:
    helpers.kill_group(proc)
  assert first.returncode == 130, first.output
  time.sleep(3)
  second = helpers.run_launcher([
      PROBE, f'--workdir={tmp_path}', '--config.steps=40',
      '--config.log_every=1', '--config.checkpoint_every=5',
      '--local_processes=2', '--local_devices=4'
  ],
                                timeout=150)
  assert second.returncode == 0, second.output
  rollup = goodput_rollup.rollup(layout.Record(str(tmp_path)))
  assert len(rollup['attempts']) == 2
  assert rollup['goodput'] <= 1.0, rollup
  assert abs(sum(rollup['parts'].values()) - rollup['wall_s']) < 1e-6
  assert rollup['parts']['restart_backoff'] == 0
  assert rollup['between_commands_s'] >= 3
  helpers.assert_no_survivors(tmp_path)


def test_the_high_water_mark_survives_sigkill(tmp_path):
  path = tmp_path / 'goodput' / 'a1' / 'rank_1.step'
  helpers.run_then_sigkill('import os\nfrom runtime.common import goodput\n'
                           f'mark = goodput.HighWater({str(path)!r})\n'
                           'for step in range(1, 74):\n'
                           '  mark.write(step)')
  assert goodput.HighWater.read(str(path)) == 73
  ledger = goodput.Ledger()
  ledger.path = str(tmp_path / 'goodput' / 'a2' / 'rank_0.json')
  # Any process's furthest step of any earlier attempt.
  assert goodput.steps_done_before(ledger) == 73
