"""--create, babysitting and clean-up against an emulated Cloud TPU service.

The queued resources, their states and spot preemptions come from
tests/fake_gcloud/cloud.py, which follows the Cloud SDK: a create returns
once the request is accepted, the request then goes ACCEPTED,
WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE; a preempted one SUSPENDING and
SUSPENDED with its nodes PREEMPTED and its VMs shut down; a delete passes
DELETING and needs --force while nodes exist.
"""

import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from runtime.common import exit_codes
from tests import gcs as gcs_lib
from tests import helpers
from tests import tpu_emulation

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

NAME = 'fleet-run'
CREATE = [
    '--create', '--accelerator_type=v4-16',
    '--runtime_version=tpu-ubuntu2204-base', '--poll_interval=0.5'
]
LINEAR = [
    '--config=configs/linear_regression.py', '--config.steps=30',
    '--local_devices=4'
]
PROBE = [f'--config={helpers.PROBE_CONFIG}', '--local_devices=4']
# A shell loop for the job where JAX is not the point: 5 steps, then exit 0.
SHORT = ['--standin.steps=5']
ENDLESS = ['--standin.steps=0']


class Fleet(tpu_emulation.FakePod):
  """An emulated service where the launch creates its own slice."""

  def args(self, *script_args, standin=False, **kwargs):
    if standin:
      kwargs['python'] = tpu_emulation.STANDIN
    return super().args(*script_args, tpu=NAME, **kwargs)


def _fleet(tmp_path, **env) -> Fleet:
  timings = dict(FAKE_QR_WAIT_S='0.5', FAKE_QR_PROVISION_S='0.5')
  timings.update(env)
  return Fleet(tmp_path, **timings)


@pytest.fixture
def cleanup():
  """Fails a test that leaves a queued resource or a process behind."""
  made = []
  yield made.append
  for fleet in made:
    # A deleted queued resource's clock process ends a moment later.
    helpers.wait_for(lambda: not fleet.processes(), 10)
    left = fleet.processes()
    fleet.kill_leftovers()
    assert not left, f'processes left: {left}'


def _created(fleet) -> list[list[str]]:
  return [
      c for c in fleet.gcloud_calls()
      if c[2:4] == ['queued-resources', 'create']
  ]


def test_create_waits_through_every_phase_and_deletes_after(tmp_path, cleanup):
  fleet = _fleet(tmp_path, FAKE_QR_WAIT_S='1.5', FAKE_QR_PROVISION_S='1.5')
  cleanup(fleet)
  result = fleet.run(*CREATE,
                     '--spot',
                     '--valid_until=6h',
                     '--delete_after',
                     '--',
                     *SHORT,
                     standin=True)
  assert result.returncode == 0, result.output
  # A loaded machine's poll can fall between two answers and miss a phase,
  # so the launcher is held to every state the service showed it.
  shown = fleet.states_shown(NAME)
  assert 'ACTIVE' in shown, shown
  shown = shown[:shown.index('ACTIVE')]
  phases = ('ACCEPTED', 'WAITING_FOR_RESOURCES', 'PROVISIONING')
  assert shown == [s for s in phases if s in shown], shown
  for state in shown:
    assert f'{NAME}: queued resource {state}' in result.stderr
  assert (f'{NAME}: queued resource ACTIVE; node(s) {NAME} READY/HEALTHY'
          in result.stderr)
  (create,) = _created(fleet)
  assert create[4:] == [
      NAME, '--accelerator-type=v4-16', '--runtime-version=tpu-ubuntu2204-base',
      f'--node-id={NAME}', '--spot', '--valid-until-duration=6h',
      '--zone=zone-a', '--project=proj'
  ]
  assert 'standin: process 1 done' in fleet.log(1)
  assert ('setting up every worker (unpacking the code; nothing is '
          'installed: --worker_python=') in result.stderr
  assert 'the job ended (--delete_after): deleting queued resource' in (
      result.stderr)
  assert fleet.queued_resources() == []
  # The service's clock records 'deleted' a tick after the resource is gone
  # (missed once in a loaded suite).
  helpers.wait_for(lambda: len(fleet.events()) >= 3, 10)
  assert [e['event'] for e in fleet.events()
         ] == ['created', 'delete', 'deleted']


def test_a_slice_is_kept_without_delete_after_and_is_never_taken_over(
    tmp_path, cleanup):
  fleet = _fleet(tmp_path)
  cleanup(fleet)
  kept = fleet.run(*CREATE, '--', *SHORT, standin=True)
  assert kept.returncode == 0, kept.output
  assert f'queued resource {NAME} is kept' in kept.stderr
  (left,) = fleet.queued_resources()
  assert left['state']['state'] == 'ACTIVE'
  # Another --create under that name: refused, and the slice left alone.
  again = fleet.run(*CREATE,
                    '--delete_after',
                    '--',
                    *SHORT,
                    standin=True,
                    job_id='again')
  assert again.returncode == exit_codes.CONFIG_ERROR, again.output
  assert f'queued resource {NAME} already exists' in again.stderr
  assert "it is not this launch's to create or delete" in again.stderr
  assert len(fleet.queued_resources()) == 1
  # --status reads the queued resource, then the workers.
  status = fleet.run('--status', job_id='')
  assert status.returncode == 0, status.output
  assert (f'queued resource {NAME}: queued resource ACTIVE; node(s) '
          f'{NAME} READY/HEALTHY') in status.stdout
  assert '[worker 1] podrun: job test-job-a1: finished with exit code 0' in (
      status.stdout)
  deleted = fleet.gcloud('compute', 'tpus', 'queued-resources', 'delete', NAME,
                         '--zone=zone-a', '--force', '--quiet')
  assert deleted.returncode == 0, deleted.stderr
  assert fleet.queued_resources() == []


def test_each_phase_has_its_own_timeout(tmp_path, cleanup):
  # Slow to get capacity, quick to provision: a provisioning timeout
  # shorter than the whole create is not reached, since each phase counts
  # from its own start.
  slow = _fleet(tmp_path / 'slow',
                FAKE_QR_WAIT_S='3',
                FAKE_QR_PROVISION_S='0.3')
  cleanup(slow)
  result = slow.run(*CREATE,
                    '--capacity_timeout=30',
                    '--provisioning_timeout=2',
                    '--delete_after',
                    '--',
                    *SHORT,
                    standin=True)
  assert result.returncode == 0, result.output
  assert slow.queued_resources() == []
  # A capacity phase over its limit: named, and what it created deleted.
  late = _fleet(tmp_path / 'late', FAKE_QR_WAIT_S='60')
  cleanup(late)
  result = late.run(*CREATE, '--capacity_timeout=2', '--', *SHORT, standin=True)
  assert result.returncode == exit_codes.POD_UNAVAILABLE, result.output
  assert (f'queued resource {NAME}: the capacity phase took over 2 s '
          '(--capacity_timeout); still queued resource '
          'WAITING_FOR_RESOURCES. Raise --capacity_timeout') in result.stderr
  assert 'the slice is not up: deleting queued resource' in result.stderr
  assert late.queued_resources() == []
  # With --delete_after too: no job ran, and the message says so.
  never = _fleet(tmp_path / 'never', FAKE_QR_WAIT_S='60')
  cleanup(never)
  result = never.run(*CREATE,
                     '--capacity_timeout=2',
                     '--delete_after',
                     '--',
                     *SHORT,
                     standin=True)
  assert result.returncode == exit_codes.POD_UNAVAILABLE, result.output
  assert 'the slice is not up: deleting queued resource' in result.stderr
  assert 'the job ended' not in result.stderr


def test_a_lost_slice_is_deleted_once_its_job_has_saved(tmp_path, cleanup):
  # The VMs get 10 s from SIGTERM to SIGKILL, the job's preemption save
  # takes 3 s, and a delete would end the VMs at once: the driver waits for
  # the job to end before it deletes the slice.
  saved = tmp_path / 'saved'
  saved.mkdir()
  fleet = _fleet(tmp_path,
                 FAKE_QR_PREEMPT_ON_LOG='step 3\n',
                 FAKE_TPU_PREEMPT_GRACE_S='10')
  cleanup(fleet)
  result = fleet.run(*CREATE,
                     '--spot',
                     '--',
                     *ENDLESS,
                     '--standin.term_save_s=3',
                     f'--standin.saved_dir={saved}',
                     standin=True)
  assert result.returncode == exit_codes.PREEMPTED, result.output
  assert 'the slice is lost under job test-job' in result.stderr
  assert 'for the job on the lost slice to end' in result.stderr
  assert 'the slice is not up: deleting queued resource' in result.stderr
  assert sorted(p.name for p in saved.iterdir()) == ['saved_0',
                                                     'saved_1'], (result.output)
  assert fleet.queued_resources() == []


def test_a_relaunch_waits_for_a_slice_that_is_still_going(tmp_path, cleanup):
  """About 25-40 s: the emulated service shows the preemption 4 s late, the
  driver's --relaunch_grace waits for it, then the slice is recreated."""
  # The service shows the preemption 4 s after the VMs got SIGTERM; the job
  # exits 75 at once. Without the grace the driver would relaunch on VMs
  # that are going, and lose that attempt too.
  fleet = _fleet(tmp_path,
                 FAKE_QR_PREEMPT_ON_LOG='step 3\n',
                 FAKE_QR_STATE_LAG_S='4')
  cleanup(fleet)
  result = fleet.run(*CREATE,
                     '--spot',
                     '--max_restarts=1',
                     '--delete_after',
                     '--',
                     *SHORT,
                     '--standin.term_save_s=0',
                     f'--standin.saved_dir={tmp_path}',
                     standin=True)
  assert result.returncode == 0, result.output
  assert '(--relaunch_grace) before relaunching there' in result.stderr
  attempts = helpers.read_jsonl(fleet.logs / 'attempts.jsonl')
  assert [a['kind'] for a in attempts] == ['preempted', 'ok'], attempts
  assert attempts[1]['infrastructure']['seconds'] > 0  # Recreated first.
  helpers.wait_for(lambda: len(fleet.events()) >= 7, 10)
  assert [e['event'] for e in fleet.events()] == [
      'created', 'preempted', 'delete', 'deleted', 'created', 'delete',
      'deleted'
  ]


def test_a_failed_queued_resource_is_named_and_deleted(tmp_path, cleanup):
  fleet = _fleet(tmp_path, FAKE_QR_FAIL='1')
  cleanup(fleet)
  result = fleet.run(*CREATE, '--', *SHORT, standin=True)
  assert result.returncode == exit_codes.POD_UNAVAILABLE, result.output
  # The service's message first, and no node called NOT_FOUND.
  assert (f'error: queued resource {NAME} FAILED, the service says: There '
          'is no more capacity in the zone. Try another zone') in (
              result.stderr)
  assert (f'{NAME}: queued resource FAILED: There is no more capacity in '
          f'the zone; node(s) {NAME} never created') in result.stderr
  assert 'NOT_FOUND' not in result.stderr
  assert fleet.queued_resources() == []


def _wait_for_text(proc, fleet, text: str, where: str, timeout=120) -> None:

  def seen():
    if where == 'worker_0':
      path = fleet.logs / 'worker_0.log'
      return path.exists() and text in path.read_text()
    return text in (fleet.logs / 'gcloud.log').read_text() if (
        fleet.logs / 'gcloud.log').exists() else False

  if not helpers.wait_for(seen, timeout):
    helpers.kill_group(proc)
    raise AssertionError(f'never saw {text!r} in {where}')


def test_ctrl_c_during_the_set_up_starts_nothing_and_deletes(tmp_path, cleanup):
  # The workers' tar, which unpacks the code, takes a minute: Ctrl-C then.
  slow = tmp_path / 'slowbin'
  slow.mkdir()
  marker = tmp_path / 'unpacking'
  (slow / 'tar').write_text(f'#!/bin/sh\ntouch {marker}\nsleep 60\n'
                            f'exec {shutil.which("tar")} "$@"\n')
  (slow / 'tar').chmod(0o755)
  fleet = _fleet(tmp_path)
  fleet.env['FAKE_TPU_WORKER_PATH'] = (
      f'{slow}:{fleet.env["FAKE_TPU_WORKER_PATH"]}')
  cleanup(fleet)
  proc = fleet.start(*CREATE, '--', *ENDLESS, standin=True)
  started = time.monotonic()
  try:
    assert helpers.wait_for(marker.exists, 120), 'the set-up never began'
    os.killpg(proc.pid, signal.SIGINT)
    result = helpers.finish(proc, 60, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 130, result.output
  assert f'got SIGINT: deleting queued resource {NAME}' in result.stderr
  assert fleet.queued_resources() == []
  ran = [
      c for c in fleet.gcloud_calls()
      if any(' run test-job-a1 ' in a for a in c)
  ]
  assert ran == [], 'no job is started after a Ctrl-C in the set-up'
  assert helpers.wait_for(lambda: not fleet.processes(),
                          30), (fleet.processes())


# Ctrl-C from a terminal (SIGINT to the whole process group: the script,
# gcloud and its ssh clients) in each phase; SIGTERM to the script alone
# while the slice is still being made.
@pytest.mark.parametrize('phase,env,text,where,how', [
    ('capacity', {
        'FAKE_QR_WAIT_S': '120'
    }, 'queued-resources create', 'gcloud', 'terminal'),
    ('provisioning', {
        'FAKE_QR_PROVISION_S': '120'
    }, 'queued-resources create', 'gcloud', 'terminal'),
    ('ready', {
        'FAKE_NODE_UNHEALTHY_S': '120'
    }, 'queued-resources create', 'gcloud', 'terminal'),
    ('job', {}, 'step 2\n', 'worker_0', 'terminal'),
    ('capacity', {
        'FAKE_QR_WAIT_S': '120'
    }, 'queued-resources create', 'gcloud', 'sigterm'),
    ('provisioning', {
        'FAKE_QR_PROVISION_S': '120'
    }, 'queued-resources create', 'gcloud', 'sigterm'),
],
                         ids=[
                             'ctrl_c-capacity', 'ctrl_c-provisioning',
                             'ctrl_c-ready', 'ctrl_c-job', 'sigterm-capacity',
                             'sigterm-provisioning'
                         ])
def test_ctrl_c_in_any_phase_deletes_what_the_launch_created(
    tmp_path, cleanup, phase, env, text, where, how):
  fleet = _fleet(tmp_path, **env)
  cleanup(fleet)
  proc = fleet.start(*CREATE, '--', *ENDLESS, standin=True)
  _wait_for_text(proc, fleet, text, where)
  if phase != 'job':  # Into the phase itself.
    wanted = {
        'capacity': 'WAITING_FOR_RESOURCES',
        'provisioning': 'PROVISIONING',
        'ready': 'ACTIVE'
    }[phase]
    assert helpers.wait_for(
        lambda: [q['state']['state']
                 for q in fleet.queued_resources()] == [wanted], 60)
    # ('ready': ACTIVE, its node READY but not yet HEALTHY for 120 s.)
  started = time.monotonic()
  if how == 'terminal':  # Ctrl-C: SIGINT to gcloud and ssh as well.
    os.killpg(proc.pid, signal.SIGINT)
  else:
    os.kill(proc.pid, signal.SIGTERM)
  try:
    result = helpers.finish(proc, 60, started)
  finally:
    helpers.kill_group(proc)
  signum = signal.SIGINT if how == 'terminal' else signal.SIGTERM
  assert result.returncode == 128 + signum, result.output
  assert f'got {signum.name}: deleting queued resource {NAME}' in (
      result.stderr)
  assert fleet.queued_resources() == []
  assert helpers.wait_for(lambda: not fleet.processes(),
                          60 - (time.monotonic() - started)), fleet.processes()
  if phase == 'job':
    assert f'got {signum.name}: stopping job test-job on every worker' in (
        result.stderr)


def test_dry_run_prints_the_queued_resource_commands(tmp_path):
  fleet = _fleet(tmp_path)
  result = subprocess.run(fleet.args(*CREATE, '--reserved', '--num_slices=2',
                                     '--delete_after', '--max_restarts=3',
                                     '--dry_run', '--', *LINEAR),
                          cwd=helpers.REPO,
                          env=fleet.env,
                          capture_output=True,
                          text=True,
                          timeout=120,
                          check=False)
  assert result.returncode == 0, result.stderr
  assert not fleet.calls.exists()
  # The workdir would die with the slice: said loudly, naming the fix.
  assert ("warning: the launcher's default workdir (workdirs/CONFIG) is on "
          "the VMs' own disks, and its disks go with the slice") in (
              result.stderr), result.stderr
  assert 'Put it in a bucket: --workdir=gs://BUCKET/RUN' in result.stderr
  lines = result.stdout.splitlines()
  create = next(l for l in lines if ' queued-resources create ' in l)
  assert shlex.split(create)[5:] == [
      NAME, '--accelerator-type=v4-16', '--runtime-version=tpu-ubuntu2204-base',
      '--node-count=2', f'--node-prefix={NAME}', '--reserved', '--zone=zone-a',
      '--project=proj'
  ]
  for node in (f'{NAME}-0', f'{NAME}-1'):
    assert any(f'tpu-vm describe --zone=zone-a --project=proj {node} ' in l
               for l in lines)
  runs = [l for l in lines if ' run test-job-a1 ' in l]
  assert len(runs) == 2
  for slice_id, run in enumerate(runs):
    assert f'--slice_id={slice_id}' in run
    assert f'MEGASCALE_SLICE_ID={slice_id}' in run
    assert 'MEGASCALE_NUM_SLICES=2' in run
  assert any(
      l.startswith('# at the end (--delete_after), on Ctrl-C or '
                   'SIGTERM, or after a preemption: gcloud compute '
                   'tpus queued-resources delete fleet-run --force')
      for l in lines)
  # v4-16 has 2 hosts: every all-worker ssh batches both, the job expects
  # 2 x 2 slices, and the Python check is spelled out once per slice.
  ssh = [l for l in lines if ' tpu-vm ssh ' in l]
  assert len(ssh) == 2 * 4, ssh  # check, set-up, run, stop per slice.
  assert all(' --worker=all --batch-size=2 ' in l for l in ssh), ssh
  assert all('--expected_processes=4' in r for r in runs)
  assert result.stdout.count('for p in ') == 2, result.stdout
  assert '# warning: the image' not in result.stdout  # --worker_python.
  # Without --worker_python the image's Python 3.10 stops the launch unless
  # --provision_python is given; the set-up uses what the check found.
  in_bucket = subprocess.run(fleet.args(*CREATE, '--dry_run', '--', *LINEAR,
                                        '--workdir=gs://runs/linear'),
                             cwd=helpers.REPO,
                             env=fleet.env,
                             capture_output=True,
                             text=True,
                             timeout=120,
                             check=False)
  assert in_bucket.returncode == 0, in_bucket.stderr
  assert 'its disks go with the slice' not in in_bucket.stderr
  for extra, warned in (((), True), (('--provision_python',), False)):
    plan = subprocess.run(fleet.args(*CREATE,
                                     *extra,
                                     '--dry_run',
                                     '--',
                                     *LINEAR,
                                     python=''),
                          cwd=helpers.REPO,
                          env=fleet.env,
                          capture_output=True,
                          text=True,
                          timeout=120,
                          check=False)
    assert plan.returncode == 0, plan.stderr
    assert 'its disks go with the slice' in plan.stderr
    assert plan.stdout.count('for p in python3.13 ') == 1, plan.stdout
    assert (('# warning: the image tpu-ubuntu2204-base has Python 3.10, and '
             'JAX ') in plan.stdout) == warned, plan.stdout


STEPS = helpers.STRAIGHT_STEPS
BABYSAT = [
    *PROBE, f'--config.steps={STEPS}', '--config.log_every=1',
    '--config.checkpoint_every=5', '--config.fail_mode=slow',
    '--config.fail_rank=0', '--config.fail_step=0', '--config.fail_seconds=0.1'
]


def _fingerprint(workdir: pathlib.Path, rank: int = 0) -> str:
  return helpers.read_json(workdir / 'ranks' /
                           f'rank_{rank}.json')['fingerprint']['sha256']


@pytest.fixture
def gcs(tmp_path):
  with gcs_lib.FakeGcs(tmp_path) as server:
    server.bucket('runs')
    yield server


def test_two_preemptions_are_babysat_to_an_exact_resume(tmp_path, cleanup, gcs,
                                                        probe_2x4_straight):
  """About 50 s: three slices created in turn (two preempted with an 8 s
  shutdown), JAX started on each; the straight run is shared."""
  # The uninterrupted run is conftest's: BABYSAT's slow steps and its
  # checkpoints change no bit of what is trained.
  # Spot preemption when worker 0's job reaches step 12, then, on each new
  # slice, once its job has logged its second step (`eta=` is on every
  # step line but an attempt's first): events, so a slow machine is
  # preempted at the same place, and relative to wherever the preemption
  # save before let the job resume (the driver now lets that save finish).
  # Every VM and the driver reach the bucket (as ones with credentials
  # would), and a preempted or deleted VM's disk goes, so the record must
  # live there. A VM is killed 8 s into its shutdown here (Compute Engine
  # gives 30): time for the save and the record's last upload on a loaded
  # machine (at 2 s, steps 1-21 once never reached the bucket). The driver
  # goes on once both processes' last ledgers are in the bucket, not after
  # --lost_slice_wait (30 s), which gcloud's ssh retries would fill.
  fleet = _fleet(tmp_path,
                 FAKE_QR_PREEMPT_ON_LOG='step 12/,eta=',
                 FAKE_TPU_PREEMPT_GRACE_S='8',
                 FAKE_TPU_WORKER_ENV=json.dumps(gcs.env()),
                 **gcs.env())
  cleanup(fleet)
  url = 'gs://runs/babysat'
  result = fleet.run(*CREATE,
                     '--spot',
                     '--max_restarts=2',
                     '--delete_after',
                     '--poll_interval=1',
                     '--',
                     *BABYSAT,
                     f'--workdir={url}',
                     timeout=280)
  assert result.returncode == 0, result.output
  assert result.stderr.count(f'the lost processes 0, 1 wrote their last '
                             f'ledgers to {url}: going on') == 2, result.stderr
  assert 'its disks go with the slice' not in result.stderr
  assert 'cannot add the attempts' not in result.stderr, result.stderr
  assert result.stderr.count(
      'the slice is lost under job test-job: queued '
      'resource SUSPENDING; node(s) fleet-run '
      'PREEMPTED') + result.stderr.count(
          'SUSPENDED; node(s) fleet-run PREEMPTED') >= 2, result.stderr
  assert 'after 2 restart(s): 2 preemption(s)' in result.stderr
  assert not list(fleet.root.glob('fleet-run/worker_*'))  # Disks gone.
  record = gcs.fetch_record(url, tmp_path / 'record')
  for rank in (0, 1):
    assert _fingerprint(record, rank) == _fingerprint(
        probe_2x4_straight), 'the resumed job trained other bits'
  assert helpers.read_json(
      record / 'ranks' /
      'rank_0.json')['start_step'] > 12  # It resumed, not started over.
  steps = [r['step'] for r in helpers.read_jsonl(record / 'metrics.jsonl')]
  assert steps[0] == 1 and set(range(1, STEPS + 1)) <= set(steps), steps
  # gcloud's delete returns once the resource is gone; the emulated
  # service's clock records 'deleted' a tick later.
  helpers.wait_for(lambda: len(fleet.events()) >= 11, 10)
  events = fleet.events()
  assert [e['event'] for e in events
         ] == ['created', 'preempted', 'delete', 'deleted'] * 2 + [
             'created', 'delete', 'deleted'
         ]
  assert fleet.queued_resources() == []
  # From the preemption to the new create request; the target is the poll
  # interval plus 5 s (reported, not asserted: it is the machine's speed).
  gaps = [events[i + 4]['t'] - events[i + 1]['t'] for i in (0, 4)]
  print(f'preempted -> recreate request: {[round(g, 2) for g in gaps]} s')
  attempts = helpers.read_jsonl(fleet.logs / 'attempts.jsonl')
  assert [a['kind'] for a in attempts] == ['preempted'] * 2 + ['ok']
  assert all(a['infrastructure']['seconds'] > 0 for a in attempts[1:])
  # The driver left its attempts beside the record, so the bucket alone
  # tells where the time of all three attempts went.
  table = subprocess.run([
      sys.executable,
      str(helpers.REPO / 'scripts' / 'goodput.py'), url,
      f'--out={tmp_path / "goodput.png"}'
  ],
                         env=helpers.launcher_env(**gcs.env()),
                         capture_output=True,
                         text=True,
                         timeout=120,
                         check=True).stdout
  assert '3 attempt(s)' in table and 'infra' in table, table
  in_bucket = helpers.read_jsonl(record / 'logs' / 'attempts.jsonl')
  assert [
      a['name']
      for a in in_bucket
      if (a.get('infrastructure') or {}).get('seconds', 0) > 0
  ] == ['test-job-a2', 'test-job-a3'], in_bucket
  assert len(list(record.glob('goodput/*/rank_*.json'))) == 3 * 2
  # The launcher's files too: the roll-up over all three attempts, the
  # driver's recreates included, in goodput.jsonl and summary.json.
  lines = helpers.read_jsonl(record / 'goodput.jsonl')
  assert [l['attempt'] for l in lines] == [1, 2, 3], lines
  summary = helpers.read_json(record / 'summary.json')['goodput']
  assert summary['attempts'] == 3, summary
  assert summary['parts']['infrastructure_recovery'] > 0, summary
  job = helpers.read_json(record / 'logs' / 'job.json')
  assert (job['job_id'], job['launched_by'],
          job['exit_code']) == ('test-job', 'launch_tpu_pod', 0), job


def test_two_slices_form_one_job_that_trains_as_a_four_process_pod(
    tmp_path, cleanup):
  """About 30 s: a local 4 x 2 pod as the reference, then two emulated
  slices created and set up, with JAX started on four VMs."""
  job = [
      *PROBE[:1], '--local_devices=2', '--config.steps=30',
      '--config.topology.num_slices=2'
  ]
  local = helpers.run_launcher([
      *job[:2], '--config.steps=30', '--local_processes=4',
      f'--workdir={tmp_path / "local"}'
  ],
                               timeout=200)
  assert local.returncode == 0, local.output
  fleet = _fleet(tmp_path)
  cleanup(fleet)
  workdir = tmp_path / 'work'
  result = fleet.run(*CREATE,
                     '--num_slices=2',
                     '--',
                     *job,
                     f'--workdir={workdir}',
                     timeout=250)
  assert result.returncode == 0, result.output
  (create,) = _created(fleet)
  assert '--node-count=2' in create and f'--node-prefix={NAME}' in create
  for process in range(4):
    slice_id, worker = divmod(process, 2)
    home = fleet.root / f'{NAME}-{slice_id}' / f'worker_{worker}'
    env = helpers.read_json(home / 'podrun' / 'jobs' / 'test-job-a1' / 'env')
    assert env['PODRUN_PROCESS_ID'] == str(process)
    assert env['PODRUN_NUM_PROCESSES'] == env['PODRUN_EXPECTED_PROCESSES'] == '4'
    assert env['MEGASCALE_SLICE_ID'] == str(slice_id)
    assert env['MEGASCALE_NUM_SLICES'] == '2'
    assert env['MEGASCALE_COORDINATOR_ADDRESS'] == '127.0.0.1'
    assert env['MEGASCALE_PORT'] == '8080'
    assert _fingerprint(workdir, process) == _fingerprint(
        tmp_path / 'local'), f'process {process} trained other bits'
  assert 'across 2 slices' in fleet.log(0)
  status = fleet.run('--num_slices=2', '--status', job_id='')
  assert status.returncode == 0, status.output
  for slice_id in (0, 1):
    for worker in (0, 1):
      assert (f'[slice {NAME}-{slice_id}] [worker {worker}] podrun: job '
              'test-job-a1: finished with exit code 0') in status.stdout
  deleted = fleet.gcloud('compute', 'tpus', 'queued-resources', 'delete', NAME,
                         '--zone=zone-a', '--force', '--quiet')
  assert deleted.returncode == 0, deleted.stderr


def test_a_job_that_does_not_span_every_slice_stops_with_3(tmp_path, cleanup):
  """About 25-40 s: two emulated slices created and set up before the job
  can refuse them."""
  # The config insists on one slice; the launch runs two.
  fleet = _fleet(tmp_path)
  cleanup(fleet)
  result = fleet.run(*CREATE,
                     '--num_slices=2',
                     '--delete_after',
                     '--',
                     *PROBE[:1],
                     '--local_devices=2',
                     '--config.topology.num_slices=1',
                     f'--workdir={tmp_path / "work"}',
                     timeout=250)
  assert result.returncode == exit_codes.TOPOLOGY_MISMATCH, result.output
  # Every worker finds it; whichever is first, the driver stops the others.
  assert any(('config.topology.num_slices=1 but MEGASCALE_NUM_SLICES, from '
              'scripts/launch_tpu_pod.sh --num_slices=2') in fleet.log(w)
             for w in range(4)), fleet.log(0)[-3000:]
  assert fleet.queued_resources() == []


def test_a_signal_during_the_restart_back_off_deletes_what_was_created(
    tmp_path, cleanup):
  fleet = _fleet(tmp_path)
  cleanup(fleet)
  failing = tmp_path / 'fail_now'
  failing.write_text('')  # Process 0 fails at its first step, exit 7.
  proc = fleet.start(*CREATE,
                     '--max_restarts=3',
                     '--retry_exit_codes=7',
                     '--restart_backoff=120',
                     '--',
                     '--standin.fail_process=0',
                     f'--standin.fail_when={failing}',
                     standin=True)
  attempts = fleet.logs / 'attempts.jsonl'
  if not helpers.wait_for(attempts.exists, 120):
    helpers.kill_group(proc)
    raise AssertionError('the first attempt never ended')
  started = time.monotonic()
  os.kill(proc.pid, signal.SIGTERM)  # Inside the 120 s back-off.
  try:
    result = helpers.finish(proc, 60, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 128 + signal.SIGTERM, result.output
  assert 'retryable exit code 7 in 60 s' in result.stderr  # At most 60.
  assert 'got SIGTERM while waiting to restart: not restarting' in (
      result.stderr)
  assert f'got SIGTERM: deleting queued resource {NAME}' in result.stderr
  assert fleet.queued_resources() == []
  assert len(helpers.read_jsonl(attempts)) == 1  # No second attempt.
