"""scripts/launch_tpu_pod.sh against a TPU pod emulated on this machine.

tests/fake_gcloud/gcloud stands in for gcloud: each worker is a directory
that serves as its home and a local process per ssh call; the workers meet on
127.0.0.1. It behaves as the Cloud SDK and OpenSSH do (see its docstring):
the command is re-parsed by a fresh remote bash, ssh reads its stdin, an
exit of 255 is run again, a killed client leaves its remote side running.
The preflight needs the Cloud TPU API, which tests/test_tpu_pod.py covers
with a fake service, so these runs pass --skip_preflight.
"""

import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time

import jax
import pytest

from launcher.tpu import commands
from runtime.common import handoff
from runtime.common import exit_codes
from launcher.common import job_tls
from tests import helpers
from tests import tpu_emulation

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

SCRIPT = tpu_emulation.SCRIPT
FAKE_BIN = tpu_emulation.FAKE_BIN
WORKER_PYTHON = tpu_emulation.WORKER_PYTHON
FakePod = tpu_emulation.FakePod


@pytest.fixture
def pod(tmp_path):
  fake = FakePod(tmp_path)
  yield fake
  leftovers = fake.processes()
  fake.kill_leftovers()
  assert not leftovers, f'processes left on the pod: {leftovers}'


def _job_lines(log: str) -> list[str]:
  """A worker_W.log without the driver's headers and podrun lines."""
  return [
      l for l in log.splitlines()
      if not l.startswith(('===== attempt', 'podrun: '))
  ]


LINEAR = [
    '--config=configs/linear_regression.py', '--config.steps=30',
    '--local_devices=4'
]
PROBE = [f'--config={helpers.PROBE_CONFIG}', '--local_devices=4']


def _start_long_job(pod, tmp_path, *script_args, job_id='test-job'):
  """Starts a job that runs until stopped; returns once it is stepping."""
  proc = pod.start(*script_args,
                   '--',
                   *PROBE,
                   '--config.steps=100000',
                   '--config.log_every=1',
                   '--config.checkpointing=False',
                   f'--workdir={tmp_path / job_id}',
                   job_id=job_id)
  if not helpers.wait_for(
      lambda:
      (pod.logs / 'worker_0.log').exists() and 'step 2/' in pod.log(0), 120):
    helpers.kill_group(proc)
    raise AssertionError('the job never got going')
  return proc


def test_runs_the_job_on_every_emulated_worker(pod, tmp_path):
  workdir = tmp_path / 'work'
  result = pod.run('--', *LINEAR, f'--workdir={workdir}')
  assert result.returncode == 0, result.output
  for w in range(2):
    log = pod.log(w)
    assert log.startswith('===== attempt 1 of job test-job =====')
    assert log.rstrip().endswith('podrun: exit 0')
    # Every line the job wrote reached the log, once.
    assert _job_lines(log) == _job_lines(pod.job_log(w))
  assert 'step 30/30' in pod.log(0)
  # The console: worker 0 in full, the others' warnings and errors (none).
  assert '[worker 0] podrun: exit 0' in result.stdout
  assert '[worker 1] ' not in result.stdout
  prints = [
      helpers.read_json(workdir / 'ranks' / f'rank_{i}.json') for i in range(2)
  ]
  assert prints[0]['fingerprint'] == prints[1]['fingerprint']
  summary = helpers.read_json(workdir / 'summary.json')
  assert (summary['process_count'], summary['device_count']) == (2, 8)
  verbs = [c[3] if c[1] == 'tpus' else c[1] for c in pod.gcloud_calls()]
  # The network's firewall rules (ports the job needs: none closed here);
  # ssh: check, set-up, run; scp: the code, and where JAX has mutual TLS
  # the launch's authority, unpacked on every worker for its job alone.
  with_tls = job_tls.supported(jax.__version__)
  assert verbs == ['describe', 'firewall-rules', 'ssh', 'scp'
                  ] + ['scp'] * with_tls + ['ssh', 'ssh']
  assert 'no firewall rule' not in result.stderr
  for w in range(2):
    home = pod.root / f'worker_{w}'
    authority = home / 'podrun' / 'tls-test-job'
    assert authority.exists() == with_tls
    if with_tls:
      assert stat.S_IMODE(os.stat(authority).st_mode) == 0o700
      assert not list(home.glob('podrun-tls-*'))  # The archive is gone.
  if with_tls:  # Rank 0's INFO lines say how it joined.
    assert 'with mutual TLS as podrun://test-job/test-job-a1/' in (
        pod.job_log(0))
  # Every worker got the same code, named by its hash.
  code_dirs = [
      sorted((pod.root / f'worker_{w}' / 'podrun').glob('code-*'))
      for w in range(2)
  ]
  assert len(code_dirs[0]) == 1 and code_dirs[0][0].name == code_dirs[1][0].name
  assert not (code_dirs[0][0] / '.venv').exists()  # --worker_python
  assert sorted(os.listdir(pod.logs)) == [
      'attempts.jsonl', 'gcloud.log', 'worker_0.log', 'worker_1.log'
  ]


def test_a_closed_coordinator_port_is_named_before_the_job_starts(tmp_path):
  # An older recipe's rule: 8476 open, 8482 (JAX's TPU port since 0.8.1)
  # not. A warning: a rule by tags or a policy may open it unseen.
  old_recipe = [{
      'name': 'jax',
      'direction': 'INGRESS',
      'network': 'projects/p/global/networks/default',
      'sourceRanges': ['127.0.0.0/8'],
      'allowed': [{
          'IPProtocol': 'tcp',
          'ports': ['8476']
      }]
  }]
  pod = FakePod(tmp_path, FAKE_FIREWALL_RULES=json.dumps(old_recipe))
  result = pod.run('--', *LINEAR, f'--workdir={tmp_path / "work"}')
  assert result.returncode == 0, result.output
  assert ("no firewall rule of network default lets the workers reach "
          "tcp:8482 (JAX's coordinator)") in result.stderr
  assert ('gcloud compute firewall-rules create podrun-tcp-8482 '
          '--network=default --allow=tcp:8482') in result.stderr


def test_a_failing_worker_stops_the_others_and_every_line_arrives(
    pod, tmp_path):
  result = pod.run('--', *PROBE, '--config.steps=100000',
                   '--config.fail_rank=1', '--config.fail_step=40',
                   '--config.fail_code=7', '--config.log_every=1',
                   '--config.checkpointing=False',
                   f'--workdir={tmp_path / "work"}')
  assert result.returncode == 7, result.output
  assert 'worker 1 exited 7 first' in result.stderr
  assert pod.log(1).rstrip().endswith('podrun: exit 7')
  # Worker 0 learnt the cause from worker 1 itself and stopped with 10.
  assert pod.log(0).rstrip().endswith('podrun: exit 10'), pod.log(0)[-2000:]
  assert re.search(r'rank 1 on \S+ failed first: exit 7 \(SystemExit\(7\)\)',
                   pod.log(0)), pod.log(0)
  for w in range(2):  # Nothing lost after the failure, nothing twice.
    assert _job_lines(pod.log(w)) == _job_lines(pod.job_log(w))
    assert f'[worker {w}] podrun: exit' in result.stdout


def test_a_worker_exiting_255_is_not_run_again(pod, tmp_path):
  result = pod.run('--', *PROBE, '--config.steps=100000',
                   '--config.fail_rank=1', '--config.fail_step=5',
                   '--config.fail_code=255', '--config.checkpointing=False',
                   f'--workdir={tmp_path / "work"}')
  assert result.returncode == 255, result.output
  assert pod.log(1).rstrip().endswith('podrun: exit 255')
  assert 'connection to worker' not in result.stderr  # gcloud did not rerun.
  for w in range(2):
    assert pod.job_log(w).count('podrun: starting job test-job-a1') == 1


def test_a_dropped_connection_reattaches_and_the_job_goes_on(tmp_path):
  pod = FakePod(tmp_path, FAKE_SSH_DROP='1:4: run ')
  try:
    result = pod.run('--', *PROBE, '--config.steps=40', '--config.fail_rank=0',
                     '--config.fail_step=10', '--config.fail_mode=sleep',
                     '--config.fail_seconds=8', '--config.checkpointing=False',
                     f'--workdir={tmp_path / "work"}')
  finally:
    pod.kill_leftovers()
  assert result.returncode == 0, result.output
  assert 'connection to worker 1 lost (255); retrying' in result.stderr
  log = pod.log(1)
  assert 'already runs here: following it' in log
  assert _job_lines(log) == _job_lines(pod.job_log(1))  # Once each.
  assert pod.job_log(1).count('podrun: starting job test-job-a1') == 1


def test_a_sigkilled_launching_side_leaves_nothing_running(pod, tmp_path):
  proc = _start_long_job(pod, tmp_path, '--orphan_timeout=5')
  try:
    os.killpg(proc.pid, signal.SIGKILL)  # The laptop, gone: gcloud and ssh.
    proc.wait()
    assert pod.processes(), 'the job should outlive its ssh sessions a while'
    # 5 s without a follower, then SIGTERM, and SIGKILL 5 s later at most.
    assert helpers.wait_for(lambda: not pod.processes(), 40), pod.processes()
  finally:
    helpers.kill_group(proc)
  job_dirs = [
      pod.root / f'worker_{w}' / 'podrun' / 'jobs' / 'test-job-a1'
      for w in range(2)
  ]
  # The first keeper to see its follower gone stops its job; the other job
  # may then end by the preemption agreement before its own keeper looks.
  assert any('the launching side is gone' in (d / 'log').read_text()
             for d in job_dirs), [
                 (d / 'log').read_text()[-500:] for d in job_dirs
             ]
  assert all((d / 'exit').exists() for d in job_dirs)


def test_a_launch_over_a_running_job_names_it_or_replaces_it(pod, tmp_path):
  """About 30-45 s: a long job on the emulated pod, a second launch refused,
  then one that replaces it (stop grace included)."""
  first = _start_long_job(pod, tmp_path, job_id='first')
  try:
    refused = pod.run('--',
                      *LINEAR,
                      f'--workdir={tmp_path / "second"}',
                      job_id='second')
    assert refused.returncode == 11, refused.output
    assert 'job(s) first-a1 (since' in refused.stdout
    assert 'launch with --replace to stop them first' in refused.stdout
    replaced = pod.run('--replace',
                       '--',
                       *LINEAR,
                       f'--workdir={tmp_path / "second"}',
                       job_id='second')
    assert replaced.returncode == 0, replaced.output
    # The replacing launch stops the job on both workers at once; the one
    # that comes second may find its job already ended by the preemption
    # agreement with the other (and worker 0's lines alone reach the
    # console): the stop is in one worker's log at least.
    assert any(
        '--replace: stopping job first-a1' in pod.log(w) for w in range(2)), (
            pod.log(0)[-2000:], pod.log(1)[-2000:])
    helpers.finish(first, 60, time.monotonic())
  finally:
    helpers.kill_group(first)


def test_a_pod_jax_cannot_form_stops_with_3(tmp_path):
  # No cluster for JAX to find: each worker would be "process 0 of 1".
  pod = FakePod(tmp_path, FAKE_TPU_NO_CLUSTER='1')
  try:
    result = pod.run('--', *LINEAR, f'--workdir={tmp_path / "work"}')
  finally:
    pod.kill_leftovers()
  assert result.returncode == exit_codes.TOPOLOGY_MISMATCH, result.output
  # Whichever worker gets there first names it; the driver stops the other.
  assert any(("num_processes: the TPU pod's 2 workers (PODRUN_EXPECTED_"
              'PROCESSES, from scripts/launch_tpu_pod.sh) expects 2, but 1 '
              'processes joined the job') in pod.log(w) for w in range(2))
  assert not (tmp_path / 'work' / 'summary.json').exists()


def test_a_worker_with_python_3_10_fails_at_once_naming_it(tmp_path):
  old = tmp_path / 'old_python'
  old.mkdir()
  (old / 'python3').write_text('#!/bin/sh\necho 3.10\n')
  (old / 'python3').chmod(0o755)
  pod = FakePod(tmp_path, FAKE_TPU_WORKER_PATH_1=str(old))
  result = pod.run('--', *LINEAR, python='')
  assert result.returncode == exit_codes.CONFIG_ERROR, result.output
  assert 'worker 1: found ' + str(old / 'python3') + '=3.10' in result.stderr
  assert 'launch with --provision_python' in result.stderr
  assert 'worker 0: found' not in result.stderr
  assert [c[3] for c in pod.gcloud_calls() if c[1] == 'tpus'
         ] == ['describe', 'ssh']  # No copy.
  assert result.elapsed < 120  # Stops at the check; generous for the machine.


def _worker_with_python(tmp_path) -> str:
  """A worker PATH where WORKER_PYTHON runs this interpreter."""
  bin_dir = tmp_path / 'worker0_bin'
  bin_dir.mkdir()
  (bin_dir /
   WORKER_PYTHON).write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
  (bin_dir / WORKER_PYTHON).chmod(0o755)
  return f'{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin'


def test_provision_python_installs_it_where_missing(tmp_path):
  pod = FakePod(tmp_path,
                FAKE_TPU_WORKER_PATH_0=_worker_with_python(tmp_path),
                FAKE_TPU_WORKER_PATH_1=tpu_emulation.ubuntu_2204_path(tmp_path))
  try:
    refused = pod.run('--', *LINEAR, python=WORKER_PYTHON)
    assert refused.returncode == exit_codes.CONFIG_ERROR, refused.output
    assert 'worker 1: found nothing' in refused.stderr
    assert '--provision_python' in refused.stderr
    result = pod.run('--provision_python',
                     '--',
                     *LINEAR,
                     f'--workdir={tmp_path / "work"}',
                     python=WORKER_PYTHON)
  finally:
    pod.kill_leftovers()
  assert result.returncode == 0, result.output
  assert (f'installing Python {WORKER_PYTHON[6:]} (for JAX '
          f'{commands.worker_jax_version()}) on the workers that lack it'
         ) in result.stderr
  apt = (pod.root / 'worker_1' / 'apt.log').read_text()
  assert '-y ppa:deadsnakes/ppa' in apt
  assert f'install -y -q {WORKER_PYTHON} {WORKER_PYTHON}-venv' in apt
  assert not (pod.root / 'worker_0' / 'apt.log').exists()  # It had one.
  assert 'step 30/30' in pod.log(0)


@pytest.mark.parametrize(
    'signum,to_group',
    [
        (signal.SIGTERM, False),
        (signal.SIGINT, False),
        # A terminal's Ctrl-C: SIGINT to the script, gcloud and every ssh client,
        # which die at once and leave the remote jobs running.
        (signal.SIGINT, True)
    ])
def test_a_signal_stops_every_worker_and_leaves_only_logs(
    pod, tmp_path, signum, to_group):
  proc = _start_long_job(pod, tmp_path)
  started = time.monotonic()
  try:
    if to_group:
      os.killpg(proc.pid, signum)
    else:
      os.kill(proc.pid, signum)
    result = helpers.finish(proc, 60, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 128 + signum, result.output  # 143 or 130.
  name = signal.Signals(signum).name
  assert f'got {name}: stopping job test-job on every worker' in (result.stderr)
  # The stop record: the jobs stopped by the driver, well before the orphan
  # timeout (30 s) would have. The stops run on both workers at once, and
  # one job may end by the preemption agreement with the other before its
  # own stop looks: then it "is not running here" any more.
  stops = (pod.logs / 'stop.log').read_text()
  said = [
      re.search(
          rf'\[worker {w}\] podrun: job test-job-a1 (stopped|is '
          'not running here)', stops) for w in range(2)
  ]
  assert all(said) and 'stopped' in [m.group(1) for m in said], stops
  assert helpers.wait_for(lambda: not pod.processes(), 20), pod.processes()
  for w in range(2):  # Each job's end recorded by its keeper.
    assert (pod.root / f'worker_{w}' / 'podrun' / 'jobs' / 'test-job-a1' /
            'exit').exists()
  for w in range(2):
    assert 'the launching side is gone' not in pod.job_log(w)
  assert all(
      n.endswith(('.log', '.jsonl')) for n in os.listdir(pod.logs)), os.listdir(
          pod.logs)


def test_status_and_stop(pod, tmp_path):
  proc = _start_long_job(pod, tmp_path, job_id='long')
  try:
    status = pod.run('--status', job_id='')
    assert status.returncode == 0, status.output
    for w in range(2):
      assert f'[worker {w}] podrun: job long-a1: running since' in (
          status.stdout)
    stopped = pod.run('--stop=long', job_id='')
    assert stopped.returncode == 0, stopped.output
    # The stops run on both workers at once, and one job may end by the
    # preemption agreement with the other before its own stop looks.
    said = [
        re.search(
            rf'\[worker {w}\] podrun: job long-a1 (stopped|is not '
            'running here)', stopped.stdout) for w in range(2)
    ]
    assert all(said) and 'stopped' in [m.group(1) for m in said
                                      ], (stopped.stdout)
    launcher = helpers.finish(proc, 60, time.monotonic())
    # --stop is SIGTERM: the job saves and every worker exits 75, which the
    # launching side passes on.
    assert launcher.returncode == exit_codes.PREEMPTED, launcher.output
    status = pod.run('--status', job_id='')
    assert '[worker 0] podrun: job long-a1: finished with exit code 75' in (
        status.stdout)
  finally:
    helpers.kill_group(proc)


def test_a_preempted_run_is_relaunched(pod, tmp_path):
  """About 25-35 s: two attempts of a job on the emulated pod, the first
  preempted."""
  workdir = tmp_path / 'work'
  result = pod.run('--max_restarts=1', '--', *PROBE, '--config.steps=30',
                   '--config.fail_rank=1', '--config.fail_step=12',
                   '--config.fail_code=75', '--config.fail_once=True',
                   '--config.checkpoint_every=5', f'--workdir={workdir}')
  assert result.returncode == 0, result.output
  assert 'restart 1/1 after a preemption' in result.stderr
  assert '===== attempt 2 of job test-job =====' in pod.log(0)
  assert helpers.read_json(workdir / 'ranks' /
                           'rank_0.json')['start_step'] == 10


HOSTILE = [
    '--config.note=a b "c" \'d\'', '$HOME', '`touch PWNED1`', '; touch PWNED2',
    '$(touch PWNED3)', "it's", 'tab\there', '*', '\\n', '&& touch PWNED4 ||', ''
]


def test_hostile_arguments_arrive_unchanged_and_unexecuted(pod, tmp_path):
  note = 'x $(touch PWNED5) `touch PWNED6` "; touch PWNED7'
  result = pod.run('--env',
                   f'NOTE={note}',
                   '--',
                   *HOSTILE,
                   python=str(FAKE_BIN / 'record_args'),
                   timeout=120)
  assert result.returncode == 0, result.output
  for w in range(2):
    home = pod.root / f'worker_{w}'
    received = (home / 'args.bin').read_bytes().split(b'\0')[:-1]
    assert [a.decode() for a in received] == ['-u', '-m', 'launcher', *HOSTILE]
    assert (home / 'note.txt').read_text() == note
  assert not list(tmp_path.rglob('PWNED*'))
  assert not list(helpers.REPO.glob('PWNED*'))


def test_dry_run_prints_every_command_and_runs_none(pod):
  result = subprocess.run(pod.args('--dry_run',
                                   '--env',
                                   'A=b c',
                                   '--',
                                   *LINEAR,
                                   '--config.note=x y',
                                   python='/opt/py thon/bin/python'),
                          cwd=helpers.REPO,
                          env=pod.env,
                          capture_output=True,
                          text=True,
                          timeout=120,
                          check=False)
  assert result.returncode == 0, result.stderr
  assert not pod.calls.exists() and not pod.root.exists()
  lines = result.stdout.splitlines()
  assert lines[0] == f'# job test-job, logs in {pod.logs}'
  assert lines[1] == (f"# the code: podrun's checkout {helpers.REPO}; the "
                      'job runs from it')
  assert lines[2] == ('gcloud compute tpus tpu-vm describe --zone=zone-a '
                      '--project=proj fake-pod --format=json')
  run = next(l for l in lines if ' run test-job-a1 ' in l)
  words = shlex.split(shlex.split(run)[-1].split('=', 1)[1])
  # What the real attempt tells each worker: the job's authority where the
  # workers' JAX (this one, here) has mutual TLS.
  tls_dir = (['--env=PODRUN_TLS_DIR=~/podrun/tls-test-job']
             if job_tls.supported(jax.__version__) else [])
  assert words[words.index('run'):] == [
      'run', 'test-job-a1', '--python=/opt/py thon/bin/python',
      '--env=PYTHONPATH=$HOME/podrun/code-<code sha256[:16]>/podrun',
      '--expected_processes=<workers from describe>', '--stop_grace=5',
      '--orphan_timeout=30', '--accelerator_devices=/dev/accel*,/dev/vfio/*',
      *tls_dir, '--env=PODRUN_JOB_ID=test-job',
      '--env=PODRUN_ATTEMPT=test-job-a1', '--env=A=b c', '--', *LINEAR,
      '--config.note=x y'
  ]
  assert lines[-2] == '# on a failure, Ctrl-C or SIGTERM:'
  assert 'tpu_worker.py" stop test-job-a1 --grace=5' in lines[-1]


def test_with_a_bucket_the_driver_writes_the_launchers_files(pod):
  """Where the workdir is a bucket, the driver completes its record after
  its last attempt (launcher_record.py), so every worker is told that
  a launcher writes the launcher's files: process 0 writes none of them
  (layout.writer), and goodput.jsonl has one writer."""

  def run_words(*launcher_args):
    result = subprocess.run(pod.args('--dry_run', '--', *LINEAR,
                                     *launcher_args),
                            cwd=helpers.REPO,
                            env=pod.env,
                            capture_output=True,
                            text=True,
                            timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    run = next(
        l for l in result.stdout.splitlines() if ' run test-job-a1 ' in l)
    return shlex.split(shlex.split(run)[-1].split('=', 1)[1])

  told = f'--env={handoff.LAUNCHER_RECORD}=1'
  assert told in run_words('--workdir=gs://runs/linear')
  assert told not in run_words('--workdir=/tmp/runs/linear')


def test_bad_arguments_exit_2_naming_them(pod):
  for args, message in (
      ([SCRIPT, '--zone=z', '--', *LINEAR], 'the following arguments are '
       'required: --tpu'),
      ([SCRIPT, '--tpu=t', '--zone=z'], 'give the launcher flags after --'),
      ([SCRIPT, '--tpu=t', '--zone=z', '--frobnicate', '--',
        *LINEAR], 'unrecognized arguments: --frobnicate'),
      ([SCRIPT, '--tpu=t', '--zone=z', '--env', 'A B=c', '--',
        *LINEAR], 'expected KEY=VALUE with KEY a variable name'),
  ):
    result = subprocess.run(args,
                            cwd=helpers.REPO,
                            env=pod.env,
                            capture_output=True,
                            text=True,
                            timeout=60,
                            check=False)
    assert result.returncode == exit_codes.CONFIG_ERROR, result.stderr
    assert message in result.stderr
  assert not pod.calls.exists()


def test_a_busy_accelerator_is_named_and_freed_only_when_asked(pod, tmp_path):
  devices = tmp_path / 'dev'
  (devices / 'vfio').mkdir(parents=True)
  for name in ('accel0', 'vfio/0'):
    (devices / name).write_bytes(b'')
  globs = f'--accelerator_devices={devices}/accel*,{devices}/vfio/*'
  # A foreign process holding the accelerator, as a leftover of another
  # framework would.
  holder = subprocess.Popen([
      sys.executable, '-c', 'import sys, time; f = open(sys.argv[1], "rb");'
      ' time.sleep(600)',
      str(devices / 'vfio' / '0')
  ],
                            start_new_session=True)
  try:
    assert helpers.wait_for(
        lambda: any(
            os.readlink(f'/proc/{holder.pid}/fd/{fd}').endswith('vfio/0')
            for fd in os.listdir(f'/proc/{holder.pid}/fd')), 20)
    refused = pod.run(globs,
                      '--',
                      '--standin.steps=3',
                      python=tpu_emulation.STANDIN)
    assert refused.returncode == exit_codes.WORKDIR_BUSY, refused.output
    for w in range(2):
      log = pod.log(w)
      assert (f'podrun: the accelerator is busy: pid {holder.pid} '
              f'({sys.executable} -c import sys') in log, log
      assert f'holds {devices}/vfio/0' in log and 'running since 20' in log
      assert '--kill_accelerator_holders to stop the processes' in log
    assert holder.poll() is None  # Named, not touched.
    freed = pod.run(globs,
                    '--kill_accelerator_holders',
                    '--',
                    '--standin.steps=3',
                    python=tpu_emulation.STANDIN,
                    job_id='freed')
    assert freed.returncode == 0, freed.output
    assert holder.wait(timeout=30) is not None
    # Both workers see it; whichever comes first stops it.
    assert any(
        f'--kill_accelerator_holders: pid {holder.pid} stopped' in pod.log(w)
        for w in range(2))
  finally:
    holder.kill()
    holder.wait()


def test_a_stale_libtpu_lockfile_is_named_and_replace_removes_it(pod, tmp_path):
  lockfile = pod.root / 'worker_1' / 'tmp' / 'libtpu_lockfile'  # Its /tmp.
  lockfile.parent.mkdir(parents=True)
  lockfile.write_text('')
  refused = pod.run('--', '--standin.steps=3', python=tpu_emulation.STANDIN)
  assert refused.returncode == exit_codes.WORKDIR_BUSY, refused.output
  assert (f'[worker 1] podrun: a stale libtpu lockfile {lockfile} (from 20'
          in refused.stdout)
  assert 'launch with --replace to remove a stale lockfile' in pod.log(1)
  assert 'stale libtpu lockfile' not in pod.log(0)
  replaced = pod.run('--replace',
                     '--',
                     '--standin.steps=3',
                     python=tpu_emulation.STANDIN,
                     job_id='again')
  assert replaced.returncode == 0, replaced.output
  assert f'removed the stale libtpu lockfile {lockfile}' in pod.log(1)
  assert not lockfile.exists()
