"""Checkpoints in a gs:// bucket, against a real GCS JSON API on 127.0.0.1.

Every job is the probe linear regression as a 2x4 local pod, its
checkpoints in a bucket of fake-gcs-server (tests/gcs.py) and its workdir
local; the reference is the same job with its checkpoints on local disk.
No test touches a real bucket: the environment points every client at the
emulator and keeps the auth libraries off any metadata server.
"""

import os
import signal
import time

import pytest

from runtime.common import exit_codes
from tests import gcs as gcs_lib
from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

STEPS = 60
PROBE = [f'--config={helpers.PROBE_CONFIG}', '--config.log_every=1',
         '--config.checkpoint_every=10', f'--config.steps={STEPS}',
         '--local_processes=2', '--local_devices=4']
PAUSE = ['--config.fail_rank=0', '--config.fail_step=20',
         '--config.fail_mode=sleep', '--config.fail_seconds=4']


@pytest.fixture
def gcs(tmp_path):
  with gcs_lib.FakeGcs(tmp_path) as server:
    server.bucket('runs')
    yield server


@pytest.fixture(scope='module')
def straight(tmp_path_factory) -> str:
  """The fingerprint of the job with its checkpoints on local disk."""
  workdir = tmp_path_factory.mktemp('straight')
  result = helpers.run_launcher([*PROBE, f'--workdir={workdir}'])
  assert result.returncode == 0, result.output
  return helpers.fingerprints(workdir)[0]


def _start(gcs, workdir, *args):
  return helpers.start_launcher(
      [*PROBE, f'--workdir={workdir}', *args],
      env=helpers.launcher_env(**gcs.env()))


def _run(gcs, workdir, *args, timeout=180):
  proc = _start(gcs, workdir, *args)
  try:
    return helpers.finish(proc, timeout, time.monotonic())
  finally:
    helpers.kill_group(proc)


def _steps_in(gcs, prefix) -> list[int]:
  """The steps whose checkpoint is committed under gs://runs/PREFIX: the
  step's own commit_success.txt (its items have one each before it)."""
  steps = []
  for name in gcs.objects('runs', prefix + '/'):
    parts = name[len(prefix) + 1:].split('/')
    if len(parts) == 2 and parts[0].isdigit() and (
        parts[1] == 'commit_success.txt'):
      steps.append(int(parts[0]))
  return sorted(steps)


def test_a_preempted_job_resumes_exactly_from_the_bucket(gcs, tmp_path,
                                                         straight):
  ckpt = 'gs://runs/probe/ckpt'
  proc = _start(gcs, tmp_path, f'--config.checkpoint_dir={ckpt}', *PAUSE,
                '--max_restarts=1', '--restart_backoff=0.5')
  started = time.monotonic()
  try:
    assert helpers.wait_for(lambda: (tmp_path / 'metrics.jsonl').exists() and
                            '"step": 20' in (tmp_path / 'metrics.jsonl')
                            .read_text() or proc.poll() is not None, 120)
    os.kill(helpers.rank_pids(tmp_path)[1], signal.SIGTERM)
    result = helpers.finish(proc, 180, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 0, result.output
  attempts = helpers.read_jsonl(tmp_path / 'logs' / 'attempts.jsonl')
  assert [a['exit_code'] for a in attempts] == [exit_codes.PREEMPTED, 0]
  assert helpers.fingerprints(tmp_path) == [straight] * 2
  steps = _steps_in(gcs, 'probe/ckpt')
  assert steps and steps[-1] == STEPS, steps
  assert not (tmp_path / 'checkpoints').exists()  # All of it in the bucket.
  helpers.assert_no_survivors(tmp_path)


def test_two_jobs_on_one_bucket_directory_at_once_one_runs(gcs, tmp_path):
  # Two workdirs, one checkpoint directory in the bucket, started together:
  # the lease object is created with ifGenerationMatch=0, so exactly one
  # job takes it and the other stops with 11 before writing anything.
  ckpt = 'gs://runs/shared/ckpt'
  procs = [_start(gcs, tmp_path / f'job_{i}', f'--config.checkpoint_dir={ckpt}',
                  '--config.steps=30') for i in range(2)]
  started = time.monotonic()
  try:
    results = [helpers.finish(p, 180, started) for p in procs]
  finally:
    for p in procs:
      helpers.kill_group(p)
  codes = sorted(r.returncode for r in results)
  assert codes == [0, exit_codes.WORKDIR_BUSY], [r.output[-3000:]
                                                 for r in results]
  refused = next(r for r in results if r.returncode)
  assert f'{ckpt} is in use by job' in refused.output or (
      f'{ckpt} was taken by' in refused.output), refused.output
  for i in range(2):
    helpers.assert_no_survivors(tmp_path / f'job_{i}')


def test_a_sigkill_restores_locally_with_the_persistent_tier_in_the_bucket(
    gcs, tmp_path, straight):
  ckpt = 'gs://runs/killed/ckpt'
  result = _run(gcs, tmp_path, f'--config.checkpoint_dir={ckpt}',
                '--config.checkpoint_every=1000',
                '--config.local_checkpoint_every=10', '--config.fail_rank=1',
                '--config.fail_step=25', '--config.fail_mode=sigkill',
                '--config.fail_once=True', '--max_restarts=1',
                '--retry_exit_codes=137', '--restart_backoff=0.5')
  assert result.returncode == 0, result.output
  attempts = helpers.read_jsonl(tmp_path / 'logs' / 'attempts.jsonl')
  assert [a['exit_code'] for a in attempts] == [137, 0]
  ledgers = {}
  for path in tmp_path.glob('goodput/*/rank_*.json'):
    ledgers.setdefault(path.parent.name, {})[path.stem] = helpers.read_json(
        path)
  last = max(ledgers.values(), key=lambda a: a['rank_0']['started'])
  assert [(last[r]['notes']['restore_tier'], last[r]['notes']['restore_step'])
          for r in ('rank_0', 'rank_1')] == [('local', 20)] * 2
  assert _steps_in(gcs, 'killed/ckpt') == [STEPS]
  assert helpers.fingerprints(tmp_path) == [straight] * 2
  helpers.assert_no_survivors(tmp_path)


def test_the_bucket_gone_mid_run_names_it_and_the_next_run_resumes(
    gcs, tmp_path, straight):
  # Rank 0 pauses 6 s at step 25, after the checkpoint of step 20; the
  # bucket goes meanwhile, so the save of step 30 cannot reach it.
  # No local tier: the resume must come from the bucket's checkpoints.
  ckpt = 'gs://runs/unreachable/ckpt'
  no_local = '--config.local_checkpoint_every=0'
  proc = _start(gcs, tmp_path, f'--config.checkpoint_dir={ckpt}', no_local,
                '--config.fail_rank=0', '--config.fail_step=25',
                '--config.fail_mode=sleep', '--config.fail_seconds=6')
  started = time.monotonic()
  try:
    assert helpers.wait_for(
        lambda: _steps_in(gcs, 'unreachable/ckpt') == [10, 20] or
        proc.poll() is not None, 120)
    assert helpers.wait_for(lambda: '"step": 25' in (
        tmp_path / 'metrics.jsonl').read_text(), 60)
    gcs.stop()
    failed = helpers.finish(proc, 240, started)
  finally:
    helpers.kill_group(proc)
  # The save of step 30 cannot complete, so the one of step 40 waits for
  # it: the watchdog ends the job naming both objects.
  assert failed.returncode == exit_codes.STALLED, failed.output
  assert ('while checkpoint (saving step 40 to gs://runs/unreachable/ckpt/40, '
          'after the save of step 30 to gs://runs/unreachable/ckpt/30 '
          'completes (is the storage reachable?))') in failed.stderr, (
              failed.stderr[-3000:])
  helpers.assert_no_survivors(tmp_path)
  gcs.start()
  assert _steps_in(gcs, 'unreachable/ckpt') == [10, 20]
  again = _run(gcs, tmp_path, f'--config.checkpoint_dir={ckpt}', no_local)
  assert again.returncode == 0, again.output
  assert 'resuming at step 20' in again.stderr
  assert helpers.fingerprints(tmp_path) == [straight] * 2
