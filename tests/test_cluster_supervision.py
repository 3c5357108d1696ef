"""Supervision without a local pod: processes started by hand, as on a cluster.

Each test starts 2 or 3 `python -m launcher` processes with explicit
coordinator flags (tests/cluster.py), makes one misbehave, and checks what
every process does on its own: which exit code, how fast, what its log
names. Nothing supervises them from outside; every test checks that no
process of the job survives.
"""

import json
import re
import signal
import time

import pytest

from runtime.common import exit_codes
from launcher.common import goodput_rollup
from runtime.common import layout
from tests import cluster
from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]

PROBE = f'--config={helpers.PROBE_CONFIG}'
LONG = '--config.steps=1000000'
NO_CKPT = '--config.checkpointing=False'
# Divides over 3 processes x 1 device (and 2).
BATCH = '--config.global_batch_size=240'


def _fault_time(output: str, mode: str) -> float:
  return float(re.search(rf'probe: {mode} at ([\d.]+)', output).group(1))


def test_an_exception_on_rank_1_is_named_on_every_rank(tmp_path):
  with cluster.Cluster(tmp_path, 3, [
      PROBE, LONG, NO_CKPT, BATCH, '--config.fail_rank=1',
      '--config.fail_step=30', '--config.fail_mode=raise'
  ]) as job:
    exits = job.wait(timeout=120)
  assert exits[1].code == exit_codes.FAILED, exits[1].output
  fault = _fault_time(exits[1].output, 'raise')
  for rank in (0, 2):
    assert exits[rank].code == exit_codes.PEER_FAILED, exits[rank].output
    # Well under --heartbeat_timeout (15 s): the broadcast named it, not a
    # lost heartbeat. (The speed itself is a benchmark's, BUILD_NOTES.)
    assert exits[rank].at - fault < 10, (rank, exits[rank].at - fault)
    line = helpers.first_line_with(exits[rank].output, 'failed first')
    assert line is not None, exits[rank].output
    assert re.search(
        r'rank 1 on \S+ failed first: exit 1 \(RuntimeError: '
        r'probe: rank 1 raises on purpose\)', line), line
  # The failing rank's own traceback is in its own log.
  assert 'RuntimeError: probe: rank 1 raises on purpose' in exits[1].output


def test_a_rank_that_exits_7_keeps_its_code_and_rank_0_names_it(tmp_path):
  with cluster.Cluster(tmp_path, 2, [
      PROBE, LONG, NO_CKPT, '--config.fail_rank=1', '--config.fail_step=30',
      '--config.fail_code=7'
  ]) as job:
    exits = job.wait(timeout=120)
  assert exits[1].code == 7, exits[1].output
  assert exits[0].code == exit_codes.PEER_FAILED, exits[0].output
  assert 'failed first: exit 7' in exits[0].output
  assert exits[0].at - _fault_time(exits[1].output, 'exit') < 10  # Not 15.


# The stall watch off where a rank is killed: only the heartbeat may name
# the end, however long a loaded machine takes to notice it.
NO_STALL = '--stall_timeout=0'


def test_a_sigkilled_rank_is_named_as_lost(tmp_path):
  with cluster.Cluster(
      tmp_path, 2,
      [PROBE, LONG, NO_CKPT, NO_STALL, '--heartbeat_timeout=5']) as job:
    job.wait_until_stepping()
    killed = job.signal(1, signal.SIGKILL)
    exits = job.wait(timeout=60)
  assert exits[1].code == -signal.SIGKILL
  assert exits[0].code == exit_codes.PEER_FAILED, exits[0].output
  # --heartbeat_timeout, not JAX's own 30 s later (bounded generously).
  assert exits[0].at - killed < 5 + 25, exits[0].at - killed
  assert re.search(
      r'rank 1 on \S+ was lost: no heartbeat for \d+ s '
      r'\(--heartbeat_timeout=5\)', exits[0].output), (exits[0].output)


def test_a_hung_input_stops_every_rank_with_stacks_and_names_it(tmp_path):
  with cluster.Cluster(tmp_path, 2, [
      PROBE, LONG, NO_CKPT, '--config.fail_rank=1', '--config.fail_step=30',
      '--config.fail_mode=hang', '--stall_timeout=5'
  ]) as job:
    exits = job.wait(timeout=90)
  fault = _fault_time(exits[1].output, 'hang')
  for rank in (0, 1):
    out = exits[rank].output
    assert exits[rank].code == exit_codes.STALLED, out
    assert exits[rank].at - fault < 5 + 25, exits[rank].at - fault
    assert 'most recent call first' in out, out  # Every thread's stack.
  assert '_misbehave' in exits[1].output  # Rank 1's stack shows where.
  laggards = helpers.first_line_with(exits[0].output, 'laggards:')
  assert laggards is not None and 'laggards: rank 1 on' in laggards, (
      exits[0].output)
  assert 'the job stalled' in laggards


@pytest.mark.parametrize('step', [2, 10])
def test_a_hang_in_the_first_steps_is_named_with_default_flags(tmp_path, step):
  # Before 20 steps there is no learned pace yet; the warm-up's deadline,
  # bounded by the first step and the compilation seen, names the hang
  # long before the 600 s of --stall_timeout (this test's wait is 120 s).
  with cluster.Cluster(tmp_path, 2, [
      PROBE, LONG, NO_CKPT, '--config.fail_rank=1',
      f'--config.fail_step={step}', '--config.fail_mode=hang'
  ]) as job:
    exits = job.wait(timeout=120)
  for rank in (0, 1):
    assert exits[rank].code == exit_codes.STALLED, exits[rank].output
  stalled = helpers.first_line_with(exits[0].output, 'the job stalled')
  assert stalled is not None and 'warm-up' in stalled, exits[0].output
  assert f'after step {step} ' in (exits[0].output + exits[1].output)
  assert 'laggards: rank 1 on' in exits[0].output, exits[0].output


def test_a_hang_before_the_first_step(tmp_path):
  with cluster.Cluster(tmp_path, 2, [
      PROBE, LONG, NO_CKPT, '--config.fail_rank=1', '--config.fail_step=0',
      '--config.fail_mode=hang', '--first_step_timeout=8'
  ]) as job:
    exits = job.wait(timeout=90)
  for rank in (0, 1):
    assert exits[rank].code == exit_codes.STALLED, exits[rank].output
    assert 'most recent call first' in exits[rank].output
  assert 'no first step completed within 8 s (--first_step_timeout)' in (
      exits[0].output + exits[1].output)
  assert 'laggards: rank 1 on' in exits[0].output, exits[0].output


def test_a_rank_that_never_joins_is_named(tmp_path):
  with cluster.Cluster(
      tmp_path,
      3,
      ['--config=configs/linear_regression.py', '--initialization_timeout=5'],
      start=[0, 1]) as job:
    exits = job.wait(timeout=60)
  for rank in (0, 1):
    assert exits[rank].code == exit_codes.DISTRIBUTED_INIT_FAILED, (
        exits[rank].output)
    assert ('the job did not form within 5 s (--initialization_timeout): '
            'rank 2 of 3 never joined') in exits[rank].output


def test_a_preemption_with_a_dead_rank_ends_in_a_bounded_wait(tmp_path):
  with cluster.Cluster(tmp_path, 3, [
      PROBE, LONG, BATCH, NO_STALL, '--heartbeat_timeout=5',
      '--config.checkpoint_every=0'
  ]) as job:
    job.wait_until_stepping()
    killed = job.signal(2, signal.SIGKILL)
    job.signal(0, signal.SIGTERM)  # A preemption notice, rank 2 gone.
    exits = job.wait(timeout=60)
  for rank in (0, 1):
    assert exits[rank].code == exit_codes.PEER_FAILED, exits[rank].output
    assert exits[rank].at - killed < 5 + 25
    assert re.search(r'rank 2 on \S+ was lost',
                     exits[rank].output), (exits[rank].output)


def test_stragglers_are_warned_about_and_step_times_summarised(tmp_path):
  # No straggler is judged from the first 20 steps (the warm-up): 70 steps
  # leave 5 s of 0.1 s steps after it for process 0 to see rank 1's.
  with cluster.Cluster(tmp_path, 2, [
      PROBE, '--config.steps=70', '--config.log_every=10', NO_CKPT,
      '--config.fail_rank=1', '--config.fail_step=5', '--config.fail_mode=slow',
      '--config.fail_seconds=0.1'
  ]) as job:
    exits = job.wait(timeout=120)
  assert [e.code for e in exits.values()] == [0, 0], exits[0].output
  warning = helpers.first_line_with(exits[0].output, 'straggler:')
  assert warning is not None, exits[0].output
  assert re.search(
      r'straggler: rank 1 on \S+ spends 0\.\d+ s of its own '
      r'per step', warning), warning
  ranks = helpers.read_json(tmp_path / 'summary.json')['ranks']
  assert [r['rank'] for r in ranks] == [0, 1]
  for r in ranks:
    assert r['step_time_median_s'] > 0.09, ranks  # Everyone waits for rank 1.
    assert r['step_time_p99_s'] >= r['step_time_median_s']
  # Rank 1 sleeps 0.1 s of its own per step; rank 0 not at all.
  assert ranks[1]['own_time_median_s'] > 0.09
  assert ranks[0]['own_time_median_s'] < ranks[1]['own_time_median_s'] / 2


def _run_probe(workdir, *args, timeout=120):
  return helpers.run_launcher([PROBE, f'--workdir={workdir}', *args],
                              timeout=timeout)


def test_a_second_job_on_a_busy_workdir_is_refused(tmp_path):
  undisturbed = _run_probe(tmp_path / 'alone', '--config.steps=40')
  assert undisturbed.returncode == 0, undisturbed.output
  busy = tmp_path / 'busy'
  # The first job pauses 12 s at step 20, holding its lease, while the
  # second starts.
  with cluster.Cluster(busy, 2, [
      PROBE, '--config.steps=40', '--config.fail_rank=0',
      '--config.fail_step=20', '--config.fail_mode=sleep',
      '--config.fail_seconds=12'
  ]) as first:
    first.wait_until_stepping(step=20)
    second = _run_probe(busy, '--config.steps=40', timeout=60)
    exits = first.wait(timeout=120)
  assert second.returncode == exit_codes.WORKDIR_BUSY, second.output
  assert re.search(r'is in use by job \S+ \(host \S+, pid \d+, since ',
                   second.output), second.output
  assert [e.code for e in exits.values()] == [0, 0], exits[0].output
  fingerprint = lambda d: helpers.read_json(d / 'ranks' / 'rank_0.json')[
      'fingerprint']
  assert fingerprint(busy) == fingerprint(tmp_path / 'alone')
  assert not (busy / '.podrun_lease.json').exists()  # Released at the end.


def test_a_stale_lease_is_taken_over(tmp_path):
  tmp_path.mkdir(exist_ok=True)
  stale = {
      'job_id': 'gone',
      'host': 'elsewhere',
      'pid': 1,
      'since': time.time() - 600,
      'renewed': time.time() - 120,
      'token': 'x'
  }
  (tmp_path / '.podrun_lease.json').write_text(json.dumps(stale))
  result = _run_probe(tmp_path, '--config.steps=10', '--lease_timeout=60')
  assert result.returncode == 0, result.output
  assert 'taking over the lease on' in result.output
  assert 'job gone (host elsewhere, pid 1' in result.output


def test_a_loop_of_its_own_started_by_hand(tmp_path):
  """The documented progress call keeps it alive; without it, 124 naming it."""
  own_loop = '--config=tests/workloads/own_loop_config.py'
  # 6 s of steps against --stall_timeout=4; the first step's clock runs
  # through the set-up and compilation, so it gets what a loaded machine
  # needs.
  with cluster.Cluster(tmp_path / 'reports', 2, [
      own_loop, '--config.step_seconds=0.6', '--first_step_timeout=60',
      '--stall_timeout=4'
  ]) as job:
    exits = job.wait(timeout=90)
  for rank in (0, 1):
    assert exits[rank].code == 0, exits[rank].output
  with cluster.Cluster(tmp_path / 'silent', 2, [
      own_loop, '--config.report=False', '--config.steps=100',
      '--first_step_timeout=3'
  ]) as job:
    exits = job.wait(timeout=90)
  for rank in (0, 1):
    assert exits[rank].code == exit_codes.STALLED, exits[rank].output
  assert 'runtime.progress.report(step)' in (exits[0].output + exits[1].output)


def _restore_notes(workdir) -> list[tuple]:
  """(restore_tier, restore_step) per rank of the attempt that started last."""
  attempts = {}
  for path in workdir.glob('goodput/*/rank_*.json'):
    attempts.setdefault(path.parent.name, {})[int(
        path.stem[len('rank_'):])] = helpers.read_json(path)
  last = max(attempts.values(), key=lambda a: a[0]['started'])
  return [(last[r]['notes'].get('restore_tier'),
           last[r]['notes'].get('restore_step')) for r in sorted(last)]


def test_a_sigkill_and_a_restart_loop_resume_from_the_local_tier(tmp_path):
  # A scheduler's loop, played by the test: start both processes, and once
  # they have ended start them again, until both exit 0. Rank 1 is
  # SIGKILLed while loading step 26; a copy every 10 steps.
  args = [
      PROBE, '--config.steps=60', '--config.checkpoint_every=1000',
      '--config.local_checkpoint_every=10', '--heartbeat_timeout=3', NO_STALL
  ]
  same_job = {r: {'PODRUN_JOB_ID': 'loop'} for r in (0, 1)}
  with cluster.Cluster(tmp_path / 'straight', 2, args) as job:
    assert [e.code for e in job.wait(timeout=120).values()] == [0, 0]
  codes = []
  for attempt in range(1, 4):
    kill = ([
        '--config.fail_rank=1', '--config.fail_step=25',
        '--config.fail_mode=sigkill'
    ] if attempt == 1 else [])
    with cluster.Cluster(tmp_path / 'loop',
                         2, [*args, *kill],
                         rank_env=same_job) as job:
      exits = job.wait(timeout=120)
    codes.append([exits[r].code for r in (0, 1)])
    if attempt == 1:
      assert re.search(r'rank 1 on \S+ was lost: no heartbeat',
                       exits[0].output), exits[0].output
    if codes[-1] == [0, 0]:
      break
  assert codes == [[exit_codes.PEER_FAILED, -signal.SIGKILL], [0, 0]], codes
  assert _restore_notes(tmp_path / 'loop') == [('local', 20)] * 2
  assert (helpers.fingerprints(tmp_path / 'loop') == helpers.fingerprints(
      tmp_path / 'straight'))
  rollup = goodput_rollup.rollup(layout.Record(str(tmp_path / 'loop')))
  recovery = rollup['attempts'][1]['recovery']
  # From the local tier; 'peer' when the kill landed between the two
  # processes' local copies of one step (the newer copy then crosses over).
  assert recovery is not None and recovery['restore_tier'] in ('local', 'peer')
  assert recovery['total_s'] == pytest.approx(sum(recovery['phases'].values()))


def _ledgers(workdir) -> dict[str, dict[int, dict]]:
  """{attempt: {rank: goodput ledger}}."""
  out = {}
  for path in workdir.glob('goodput/*/rank_*.json'):
    out.setdefault(path.parent.name, {})[int(
        path.stem[len('rank_'):])] = (helpers.read_json(path))
  return out


def test_every_end_reaches_its_ledger_when_process_0_is_killed(tmp_path):
  # Process 0 holds JAX's coordination service: SIGKILLed, it takes the
  # service with it, and the service's client aborts the survivor (SIGABRT)
  # before any supervisor of ours can act. Each obituary writes its
  # process's end; a restart then has a complete time to recover.
  args = [
      PROBE, '--config.steps=60', '--config.checkpoint_every=1000',
      '--config.local_checkpoint_every=10', '--heartbeat_timeout=5'
  ]
  same_job = {r: {'PODRUN_JOB_ID': 'abort'} for r in (0, 1)}
  with cluster.Cluster(tmp_path, 2, args, rank_env=same_job) as job:
    job.wait_until_stepping(step=25)
    job.signal(0, signal.SIGKILL)
    exits = job.wait(timeout=60)
  assert exits[0].code == -signal.SIGKILL
  [first] = _ledgers(tmp_path).values()
  notes = {r: first[r]['notes'] for r in (0, 1)}
  assert notes[0]['exit_code'] == 137, notes[0]
  assert notes[0]['cause'].startswith('killed without a trace'), notes[0]
  assert notes[0]['fault']['rank'] == 0
  if exits[1].code == -signal.SIGABRT:
    assert notes[1]['exit_code'] == 134, notes[1]
    assert notes[1]['cause'].startswith('aborted (SIGABRT)'), notes[1]
    assert 'ended without writing its end: aborted (SIGABRT)' in (
        exits[1].output)
  else:  # Our supervisor was first: its own end, naming process 0.
    assert exits[1].code == exit_codes.PEER_FAILED, exits[1].output
    assert notes[1]['fault']['rank'] == 0, notes[1]
  with cluster.Cluster(tmp_path, 2, args, rank_env=same_job) as job:
    assert [e.code for e in job.wait(timeout=120).values()] == [0, 0]
  rollup = goodput_rollup.rollup(layout.Record(str(tmp_path)))
  recovery = rollup['attempts'][1]['recovery']
  # From the local tier; 'peer' when the kill landed between the two
  # processes' local copies of one step (the newer copy then crosses over).
  assert recovery is not None and recovery['restore_tier'] in ('local', 'peer')
  assert recovery['total_s'] == pytest.approx(sum(recovery['phases'].values()))
  assert all(v >= 0 for v in recovery['phases'].values()), recovery
