"""Recovery from hard failures through the local tier, across real processes.

Every job here is the probe linear regression (tests/workloads/probe.py),
SIGKILLed (fail_mode=sigkill) while loading the batch of step KILL_STEP, with
a local copy every LOCAL_EVERY steps and persistent checkpoints only at the
end, unless a test says otherwise. The local tier lives under the session's
PODRUN_LOCAL_CHECKPOINT_DIR (tests/conftest.py).
"""

import glob
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from launcher.process import stall
from runtime.common import handoff
from runtime.common import goodput
from runtime.common import layout
from runtime.common import progress
from launcher.common import time_to_recover
from runtime.checkpoints import local_checkpoint
from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

STEPS = 120
LOCAL_EVERY = 20
KILL_STEP = 75
PROBE = [
    f'--config={helpers.PROBE_CONFIG}', '--config.log_every=5',
    f'--config.steps={STEPS}', '--config.checkpoint_every=1000',
    f'--config.local_checkpoint_every={LOCAL_EVERY}'
]
POD = ['--local_processes=2', '--local_devices=4']
RESTART = [
    '--max_restarts=1', '--retry_exit_codes=137', '--restart_backoff=0.5'
]


def _kill(rank, step=KILL_STEP):
  return [
      f'--config.fail_rank={rank}', f'--config.fail_step={step}',
      '--config.fail_mode=sigkill', '--config.fail_once=True'
  ]


def _run(workdir, *args, timeout=150):
  return helpers.run_launcher([*PROBE, f'--workdir={workdir}', *args],
                              timeout=timeout)


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
  """The undisturbed run's fingerprint, 2x4 (1x8 trains the same bits)."""
  workdir = tmp_path_factory.mktemp('straight')
  result = _run(workdir, *POD)
  assert result.returncode == 0, result.output
  return helpers.fingerprints(workdir, 2)[0]


# Each rank's local tier on a "host" of its own (LOCAL_DIR/host_<i>), as on
# machines of their own: a rank then holds no copy another rank wrote.
HOSTS = ['--config.per_rank_local_dir=True']


def _local_job_dir(workdir, host=None) -> pathlib.Path:
  job = (pathlib.Path(workdir) / 'checkpoints' /
         local_checkpoint.JOB_ID_FILE).read_text().strip()
  root = pathlib.Path(os.environ[handoff.LOCAL_CHECKPOINT_DIR])
  return (root if host is None else root / f'host_{host}') / job


def _ledgers(workdir):
  """{attempt name: {rank: ledger}} in the order the attempts started."""
  out = {}
  for path in sorted(
      glob.glob(os.path.join(workdir, 'goodput', '*', 'rank_*.json'))):
    attempt = os.path.basename(os.path.dirname(path))
    rank = int(os.path.basename(path)[5:-5])
    out.setdefault(attempt, {})[rank] = helpers.read_json(path)
  return dict(sorted(out.items(), key=lambda a: a[1][0]['started']))


def test_a_sigkilled_process_0_resumes_from_the_local_tier(tmp_path, straight):
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  result = _run(tmp_path, *POD, *_kill(0), *RESTART)
  assert result.returncode == 0, result.output
  helpers.assert_no_survivors(tmp_path)
  assert helpers.fingerprints(tmp_path, 2) == [straight] * 2
  first, second = _ledgers(tmp_path).values()
  record = layout.Record(str(tmp_path))
  furthest = max(
      goodput.HighWater.read(
          layout.high_water(record.ledger(first[r]['notes']['attempt'], r)))
      for r in first)
  assert KILL_STEP - 5 <= furthest <= KILL_STEP, furthest
  restored = furthest // LOCAL_EVERY * LOCAL_EVERY
  for rank in (0, 1):
    notes = second[rank]['notes']
    assert (notes['restore_tier'], notes['restore_step']) == ('local', restored)
    # Exact: every step after the copy up to the furthest one, no more.
    assert notes['recomputed_steps'] == furthest - restored
  attempts = helpers.read_jsonl(tmp_path / 'goodput.jsonl')
  recovery = attempts[1]['recovery']
  assert recovery['restore_tier'] == 'local'
  assert recovery['total_s'] == pytest.approx(sum(recovery['phases'].values()))
  assert set(recovery['phases']) == set(time_to_recover.PHASES)
  table = subprocess.run([
      sys.executable,
      str(helpers.REPO / 'scripts' / 'goodput.py'),
      str(tmp_path)
  ],
                         capture_output=True,
                         text=True,
                         timeout=120,
                         check=True).stdout
  assert (f'local step {restored}, {furthest - restored} step(s) again'
          in table), table
  # Every step logged once, in metrics.jsonl and in TensorBoard.
  logged = list(range(5, STEPS + 1, 5))
  records = helpers.read_jsonl(tmp_path / 'metrics.jsonl')
  assert [r['step'] for r in records if 'loss' in r] == logged
  events = event_accumulator.EventAccumulator(str(tmp_path / 'tensorboard'))
  events.Reload()
  assert [e.step for e in events.Scalars('loss')] == logged
  # A job that ended well leaves no local copy behind.
  assert not _local_job_dir(tmp_path).exists()


def test_a_cadence_in_seconds_copies_one_step_on_every_process(
    tmp_path, straight):
  # Steps of a few ms, a copy every 50 ms: process 0 picks the steps after
  # the warm-up, and both processes hold the same ones when rank 1 dies.
  in_seconds = [
      '--config.local_checkpoint_every=0',
      '--config.local_checkpoint_every_s=0.05'
  ]
  killed = _run(tmp_path, *POD, *_kill(1), *in_seconds)
  assert killed.returncode == 137, killed.output
  helpers.assert_no_survivors(tmp_path)
  held = {
      rank:
          sorted(
              int(p.name[len('step_'):])
              for p in (_local_job_dir(tmp_path) / f'rank_{rank}').iterdir()
              if p.name.startswith('step_')) for rank in (0, 1)
  }
  assert held[0] == held[1] and held[0], held
  assert all(progress.WARMUP_STEPS < s < KILL_STEP for s in held[0]), held
  rest = _run(tmp_path, *POD, *in_seconds)
  assert rest.returncode == 0, rest.output
  last = list(_ledgers(tmp_path).values())[-1]
  assert [(last[r]['notes']['restore_tier'], last[r]['notes']['restore_step'])
          for r in (0, 1)] == [('local', held[0][-1])] * 2
  assert helpers.fingerprints(tmp_path, 2) == [straight] * 2


def test_copies_of_a_deleted_workdir_go_at_the_next_start(tmp_path):
  killed = _run(tmp_path / 'a', *_kill(0))
  assert killed.returncode == -signal.SIGKILL, killed.output
  left = _local_job_dir(tmp_path / 'a')
  assert left.exists()
  other = _run(tmp_path / 'b', '--config.steps=5')
  assert other.returncode == 0, other.output
  assert left.exists(), 'a killed job that may resume keeps its copies'
  assert f'kept local copies of another job, which may resume: {left}' in (
      other.stderr)
  shutil.rmtree(tmp_path / 'a')
  again = _run(tmp_path / 'b', '--config.steps=10')
  assert again.returncode == 0, again.output
  assert not left.exists()
  assert ('removed local copies of another job, its checkpoint directory is '
          f'gone: {left}') in again.stderr


def test_a_replaced_host_restores_from_a_peer(tmp_path, straight):
  killed = _run(tmp_path, *POD, *HOSTS, *_kill(1))
  assert killed.returncode == 137, killed.output
  helpers.assert_no_survivors(tmp_path)
  shutil.rmtree(_local_job_dir(tmp_path, host=1))  # A new host.
  rest = _run(tmp_path, *POD, *HOSTS)
  assert rest.returncode == 0, rest.output
  last = list(_ledgers(tmp_path).values())[-1]
  assert [last[r]['notes']['restore_tier'] for r in (0, 1)] == ['local', 'peer']
  assert last[0]['notes']['restore_step'] == last[1]['notes']['restore_step']
  assert ("restored step 60 from process 0's local copy"
          in (tmp_path / 'logs' / 'rank_1.log').read_text())
  assert helpers.fingerprints(tmp_path, 2) == [straight] * 2
  helpers.assert_no_survivors(tmp_path)


def test_with_every_local_copy_gone_the_persistent_tier_restores(
    tmp_path, straight):
  every_40 = ['--config.checkpoint_every=40']
  killed = _run(tmp_path, *POD, *_kill(1), *every_40)
  assert killed.returncode == 137, killed.output
  shutil.rmtree(_local_job_dir(tmp_path))
  rest = _run(tmp_path, *POD, *every_40)
  assert rest.returncode == 0, rest.output
  assert 'resuming at step 40' in rest.stderr
  last = list(_ledgers(tmp_path).values())[-1]
  assert [last[r]['notes']['restore_tier'] for r in (0, 1)
         ] == ['persistent'] * 2
  assert helpers.fingerprints(tmp_path, 2) == [straight] * 2
  helpers.assert_no_survivors(tmp_path)


def test_a_sigkill_during_a_local_save_falls_back_to_the_copy_before(
    tmp_path, straight):
  result = _run(tmp_path, '--local_processes=1', '--local_devices=8',
                '--config.fail_rank=0', '--config.fail_step=-1',
                '--config.fail_once=True', '--config.kill_in_local_save=60',
                *RESTART)
  assert result.returncode == 0, result.output
  assert 'probe: sigkill in the local save of step 60' in result.output
  assert 'resuming at step 40' in result.stderr
  assert helpers.fingerprints(tmp_path, 1) == [straight]
  helpers.assert_no_survivors(tmp_path)


def test_a_1x8_local_copy_restores_on_2x4(tmp_path, straight):
  # The launcher is the process killed.
  killed = _run(tmp_path, *HOSTS, *_kill(0))
  assert killed.returncode == -signal.SIGKILL, killed.output
  rest = _run(tmp_path, *POD, *HOSTS)
  assert rest.returncode == 0, rest.output
  assert 'resuming at step 60' in rest.stderr
  last = list(_ledgers(tmp_path).values())[-1]
  assert [last[r]['notes']['restore_tier'] for r in (0, 1)] == ['local', 'peer']
  assert helpers.fingerprints(tmp_path, 2) == [straight] * 2
  helpers.assert_no_survivors(tmp_path)


def test_the_learned_deadline_ends_a_wedged_rank(tmp_path):
  result = _run(tmp_path, *POD, '--config.steps=100000', '--config.fail_rank=1',
                '--config.fail_step=150', '--config.fail_mode=hang',
                '--stall_floor=3', '--heartbeat_timeout=3')
  assert result.returncode == 124, result.output
  line = helpers.first_line_with(result.stderr, 'the job stalled')
  # The floor: --heartbeat_timeout + 2 s, so that a dead rank is named lost.
  assert 'rank 1 on' in line and 'learned: max(5 s' in line, line
  # What it learned is kept for the next attempt, also when it ends so.
  assert helpers.read_json(tmp_path / 'stall' / 'rank_0.json')['step_seconds']
  helpers.assert_no_survivors(tmp_path)


def test_the_learned_deadline_allows_for_a_long_evaluation(tmp_path):
  """About 25-35 s: two evaluations of 9 s each, longer than the learned
  deadline, on a 2-process pod."""
  # Steps of milliseconds, a floor of 5 s (--heartbeat_timeout + 2 s) and
  # evaluations of 9 s: only the announced evaluation keeps the deadline
  # from firing. The premise, K x p99 under 9 s, leaves a loaded machine
  # steps of up to 0.9 s at the 99th percentile (milliseconds when quiet).
  result = _run(tmp_path, *POD, '--config.steps=200', '--config.eval_every=100',
                '--config.eval_seconds=9', '--stall_floor=1',
                '--heartbeat_timeout=3')
  assert result.returncode == 0, result.output
  learned = helpers.read_json(tmp_path / 'stall' / 'rank_0.json')
  assert learned['work_seconds']['evaluation'] >= 9
  assert stall.K * np.percentile(learned['step_seconds'], 99) < 9
  helpers.assert_no_survivors(tmp_path)
