"""Checkpoints in a gs:// bucket, against a real GCS JSON API on 127.0.0.1.

Every job is the probe linear regression as a 2x4 local pod, its
checkpoints in a bucket of fake-gcs-server (tests/gcs.py), its workdir
there too (the record mirrored from a copy per "machine",
launcher/common/record_mirror.py) or local; the reference is the same job
on local disk alone.
No test touches a real bucket: the environment points every client at the
emulator and keeps the auth libraries off any metadata server.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from runtime.common import handoff
from runtime.common import exit_codes
from tests import gcs as gcs_lib
from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

STEPS = helpers.STRAIGHT_STEPS
PROBE = [
    f'--config={helpers.PROBE_CONFIG}', '--config.log_every=1',
    '--config.checkpoint_every=10', f'--config.steps={STEPS}',
    '--local_processes=2', '--local_devices=4'
]
PAUSE = [
    '--config.fail_rank=0', '--config.fail_step=20', '--config.fail_mode=sleep',
    '--config.fail_seconds=4'
]


@pytest.fixture
def gcs(tmp_path):
  with gcs_lib.FakeGcs(tmp_path) as server:
    server.bucket('runs')
    yield server


@pytest.fixture
def straight(probe_2x4_straight) -> str:
  """The fingerprint of the job with its checkpoints on local disk."""
  return helpers.fingerprints(probe_2x4_straight)[0]


def _start(gcs, workdir, *args, record_cache=None):
  """The probe job; a bucket's workdir copied under `record_cache`."""
  env = gcs.env()
  if record_cache is not None:
    env[handoff.RECORD_CACHE] = str(record_cache)
  return helpers.start_launcher([*PROBE, f'--workdir={workdir}', *args],
                                env=helpers.launcher_env(**env))


def _run(gcs, workdir, *args, timeout=180, record_cache=None):
  proc = _start(gcs, workdir, *args, record_cache=record_cache)
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
    if len(parts) == 2 and parts[0].isdigit() and (parts[1]
                                                   == 'commit_success.txt'):
      steps.append(int(parts[0]))
  return sorted(steps)


def _record_copy(root, url: str) -> pathlib.Path:
  """Where a machine whose PODRUN_RECORD_CACHE is `root` keeps `url`."""
  return pathlib.Path(root) / url[len('gs://'):]


def _bucket_json(gcs, name: str):
  return json.loads(gcs.read('runs', name))


def _bucket_steps(gcs, name: str) -> list[int]:
  return [
      json.loads(line)['step']
      for line in gcs.read('runs', name).decode().splitlines()
      if '"step"' in line
  ]


def test_a_preempted_job_on_a_bucket_workdir_resumes_with_one_record(
    gcs, tmp_path, straight):
  """About 25-35 s: two 2 x 4 attempts on two "machines" against the
  emulator."""
  # The whole workdir in the bucket, each run on a "machine" of its own:
  # the first machine's copy of the record is deleted before the second
  # run, as a preempted VM's disk is.
  url = 'gs://runs/probe'
  first_copy = _record_copy(tmp_path / 'machine_a', url)
  proc = _start(gcs, url, *PAUSE, record_cache=tmp_path / 'machine_a')
  started = time.monotonic()
  try:
    assert helpers.wait_for(
        lambda: (first_copy / 'metrics.jsonl').exists() and '"step": 20' in
        (first_copy / 'metrics.jsonl').read_text() or proc.poll() is not None,
        120)
    os.kill(helpers.rank_pids(first_copy)[1], signal.SIGTERM)
    first = helpers.finish(proc, 180, started)
  finally:
    helpers.kill_group(proc)
  assert first.returncode == exit_codes.PREEMPTED, first.output
  helpers.assert_no_survivors(first_copy)
  shutil.rmtree(tmp_path / 'machine_a')
  second = _run(gcs, url, record_cache=tmp_path / 'machine_b')
  assert second.returncode == 0, second.output
  assert re.search(r'resuming at step 2\d', second.stderr), second.stderr
  # The record, read from the bucket alone: the fingerprints of the
  # finished job, and one loss curve and one goodput ledger over both
  # attempts.
  assert [
      _bucket_json(gcs, f'probe/ranks/rank_{i}.json')['fingerprint']['sha256']
      for i in range(2)
  ] == [straight] * 2
  steps = _bucket_steps(gcs, 'probe/metrics.jsonl')
  assert steps[0] == 1 and steps[-1] == STEPS, steps
  assert set(range(1, STEPS + 1)) <= set(steps), steps  # Nothing missing.
  ledgers = [
      n for n in gcs.objects('runs', 'probe/goodput/') if n.endswith('.json')
  ]
  assert len(ledgers) == 4, ledgers  # 2 attempts x 2 processes.
  assert _bucket_json(gcs, 'probe/summary.json')['goodput']['attempts'] == 2
  table = subprocess.run([
      sys.executable,
      str(helpers.REPO / 'scripts' / 'goodput.py'), url,
      f'--out={tmp_path / "goodput.png"}'
  ],
                         env=helpers.launcher_env(**gcs.env()),
                         capture_output=True,
                         text=True,
                         timeout=120)
  assert table.returncode == 0, table.stderr
  assert '2 attempt(s)' in table.stdout, table.stdout
  plot = subprocess.run([
      sys.executable,
      str(helpers.REPO / 'scripts' / 'plot_metrics.py'), url,
      f'--out={tmp_path / "metrics.png"}'
  ],
                        env=helpers.launcher_env(**gcs.env()),
                        capture_output=True,
                        text=True,
                        timeout=120)
  assert plot.returncode == 0 and (tmp_path / 'metrics.png').exists(), (
      plot.stderr)
  assert [
      n for n in gcs.objects('runs', 'probe/tensorboard/')
      if '/events.out.tfevents.' in n
  ]
  assert _steps_in(gcs, 'probe/checkpoints')[-1] == STEPS
  assert not (helpers.REPO / 'gs:').exists()


def test_two_jobs_on_one_bucket_workdir_at_once_one_runs(gcs, tmp_path):
  # Two machines, one workdir in the bucket, started together: the lease
  # object is created with ifGenerationMatch=0, so exactly one job takes
  # it and the other stops with 11 before it trains.
  url = 'gs://runs/shared'
  procs = [
      _start(gcs,
             url,
             '--config.steps=30',
             record_cache=tmp_path / f'machine_{i}') for i in range(2)
  ]
  started = time.monotonic()
  try:
    results = [helpers.finish(p, 180, started) for p in procs]
  finally:
    for p in procs:
      helpers.kill_group(p)
  codes = sorted(r.returncode for r in results)
  assert codes == [0, exit_codes.WORKDIR_BUSY
                  ], [r.output[-3000:] for r in results]
  refused = next(r for r in results if r.returncode)
  assert f'{url} is in use by job' in refused.output or (
      f'{url} was taken by' in refused.output), refused.output
  for i in range(2):
    helpers.assert_no_survivors(_record_copy(tmp_path / f'machine_{i}', url))
  assert _bucket_steps(gcs, 'shared/metrics.jsonl')[-1] == 30


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
    ledgers.setdefault(path.parent.name,
                       {})[path.stem] = helpers.read_json(path)
  last = max(ledgers.values(), key=lambda a: a['rank_0']['started'])
  assert [(last[r]['notes']['restore_tier'], last[r]['notes']['restore_step'])
          for r in ('rank_0', 'rank_1')] == [('local', 20)] * 2
  assert _steps_in(gcs, 'killed/ckpt') == [STEPS]
  assert helpers.fingerprints(tmp_path) == [straight] * 2
  helpers.assert_no_survivors(tmp_path)


def test_the_bucket_gone_mid_run_names_it_and_the_next_run_resumes(
    gcs, tmp_path, straight):
  """About 40 s: the watchdog must see a save hang past its learned
  deadline, then a second run resumes; both against the emulator."""
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
        lambda: _steps_in(gcs, 'unreachable/ckpt') == [10, 20] or proc.poll() is
        not None, 120)
    assert helpers.wait_for(
        lambda: '"step": 25' in (tmp_path / 'metrics.jsonl').read_text(), 60)
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


def test_a_fresh_job_where_a_deleted_record_was_records_only_itself(
    gcs, tmp_path):
  """About 20 s: two short jobs at one URL, the bucket emptied between."""
  cache = tmp_path / 'cache'
  url = 'gs://runs/again'
  short = ['--config.steps=10', '--config.checkpointing=False']
  first = _run(gcs, url, *short, record_cache=cache)
  assert first.returncode == 0, first.output
  assert _bucket_json(gcs, 'again/summary.json')['goodput']['attempts'] == 1
  assert gcs.delete('runs', 'again/') > 0  # The user starts afresh.
  second = _run(gcs, url, *short, record_cache=cache)
  assert second.returncode == 0, second.output
  assert "this machine's copy of gs://runs/again holds" in second.stderr
  assert _bucket_json(gcs, 'again/summary.json')['goodput']['attempts'] == 1
  # This job's attempt alone, of its two processes.
  ledgers = gcs.objects('runs', 'again/goodput/')
  assert len({n.split('/')[2] for n in ledgers}) == 1, ledgers
  assert len([n for n in ledgers if n.endswith('.json')]) == 2, ledgers
  aside, = cache.glob('runs/again.set-aside-*')
  assert list(aside.glob('goodput/*/rank_0.json'))  # Kept on disk.


def test_a_silent_metadata_server_costs_a_bucket_job_nothing(gcs, tmp_path):
  """About 12 s: a job on the emulated bucket, then its resume, where
  google.auth's metadata address accepts connections and never answers
  (as behind a firewall that drops them). Each gcsfs client of each
  process searched for credentials there and waited out the timeouts
  (9.3 s for the record's fetch, 18.2 s for a restore, measured); the
  emulator takes none, so no process asks it at all."""
  url = 'gs://runs/silent'
  with gcs_lib.SilentMetadata() as silent:
    env = {
        **gcs.env(),
        **silent.env(), handoff.RECORD_CACHE: str(tmp_path / 'cache')
    }
    for steps in (10, 20):
      proc = helpers.start_launcher(
          [*PROBE, f'--workdir={url}', f'--config.steps={steps}'],
          env=helpers.launcher_env(**env))
      try:
        result = helpers.finish(proc, 180, time.monotonic())
      finally:
        helpers.kill_group(proc)
      assert result.returncode == 0, result.output
    assert 'resuming at step 10' in result.output
    assert silent.connections == 0
  assert 'finding Google credentials took' not in result.output
  assert _steps_in(gcs, 'silent/checkpoints') == [10, 20]
