"""scripts/launch_tpu_pod.sh against a TPU pod emulated on this machine.

tests/fake_gcloud/gcloud stands in for gcloud: each worker is a directory
that serves as its home and a local process per ssh call; the workers meet on
127.0.0.1. The preflight needs the Cloud TPU API, which tests/test_tpu_pod.py
covers with a fake service, so these runs pass --skip_preflight.
"""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from launcher import exit_codes
from tests import helpers

pytestmark = pytest.mark.timeout(240)

SCRIPT = str(helpers.REPO / 'scripts' / 'launch_tpu_pod.sh')
FAKE_BIN = helpers.REPO / 'tests' / 'fake_gcloud'


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class FakePod:
  """The environment and paths of one emulated pod."""

  def __init__(self, tmp_path: pathlib.Path, workers: int = 2):
    self.root = tmp_path / 'pod'
    self.logs = tmp_path / 'logs'
    self.calls = tmp_path / 'gcloud_calls.jsonl'
    self.workers = workers
    self.env = helpers.launcher_env(
        PATH=f'{FAKE_BIN}{os.pathsep}{os.environ["PATH"]}',
        FAKE_TPU_POD_ROOT=str(self.root), FAKE_TPU_WORKERS=str(workers),
        FAKE_TPU_NAME='fake-pod',
        FAKE_TPU_COORDINATOR_PORT=str(_free_port()),
        FAKE_GCLOUD_CALLS=str(self.calls),
        PODRUN_LOCAL_PYTHON=sys.executable)

  def args(self, *script_args, job_id='test-job'):
    return [SCRIPT, '--tpu=fake-pod', '--zone=zone-a', '--project=proj',
            '--skip_preflight', f'--worker_python={sys.executable}',
            f'--log_dir={self.logs}', f'--job_id={job_id}', '--stop_grace=5',
            *script_args]

  def start(self, *script_args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(self.args(*script_args, **kwargs),
                            cwd=helpers.REPO, env=self.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)

  def run(self, *script_args, timeout=200, **kwargs) -> helpers.Result:
    started = time.monotonic()
    proc = self.start(*script_args, **kwargs)
    try:
      return helpers.finish(proc, timeout, started)
    finally:
      helpers.kill_group(proc)
      self.kill_leftovers()

  def processes(self) -> list[int]:
    """Live processes of this pod (they carry its root in their environment)."""
    return helpers.processes_with_env(f'FAKE_TPU_POD_ROOT={self.root}')

  def kill_leftovers(self) -> None:
    for pid in self.processes():
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass

  def log(self, worker: int) -> str:
    return (self.logs / f'worker_{worker}.log').read_text()

  def gcloud_calls(self) -> list[list[str]]:
    return [json.loads(l) for l in self.calls.read_text().splitlines()]


LINEAR = ['--config=configs/linear_regression.py', '--config.steps=30',
          '--local_devices=4']


def test_runs_the_job_on_every_emulated_worker(tmp_path):
  pod = FakePod(tmp_path)
  workdir = tmp_path / 'work'
  result = pod.run('--', *LINEAR, f'--workdir={workdir}')
  assert result.returncode == 0, result.output
  assert not pod.processes()
  for w in range(2):
    log = pod.log(w)
    assert log.startswith('===== attempt 1 of job test-job =====')
    assert log.rstrip().endswith('podrun: exit 0')
    assert f'[worker {w}] ' in result.stdout
  assert 'step 30/30' in pod.log(0)
  prints = [helpers.read_json(workdir / 'ranks' / f'rank_{i}.json')
            for i in range(2)]
  assert prints[0]['fingerprint'] == prints[1]['fingerprint']
  summary = helpers.read_json(workdir / 'summary.json')
  assert (summary['process_count'], summary['device_count']) == (2, 8)
  verbs = [(c[3], next(a for a in c if a.startswith('--worker')))
           for c in pod.gcloud_calls()]
  assert verbs == [('scp', '--worker=all'), ('ssh', '--worker=all'),
                   ('ssh', '--worker=all')]
  # Every worker got the same code, named by its hash.
  code_dirs = [sorted((pod.root / f'worker_{w}' / 'podrun').glob('code-*'))
               for w in range(2)]
  assert len(code_dirs[0]) == 1 and code_dirs[0][0].name == code_dirs[1][0].name
  assert (code_dirs[0][0] / '.podrun-ready').exists()
  assert not (code_dirs[0][0] / '.venv').exists()  # --worker_python


def test_a_failing_worker_stops_the_others(tmp_path):
  pod = FakePod(tmp_path)
  result = pod.run(
      '--', f'--config={helpers.PROBE_CONFIG}', '--config.steps=100000',
      '--config.fail_rank=1', '--config.fail_step=5', '--config.fail_code=7',
      '--local_devices=4', '--config.checkpointing=False',
      f'--workdir={tmp_path / "work"}')
  assert result.returncode == 7, result.output
  assert 'worker 1 exited 7 first' in result.stderr
  assert 'podrun: exit 7' in pod.log(1)
  # Worker 0 learnt the cause from worker 1 itself and stopped with 10.
  assert re.search(r'rank 1 on \S+ failed first: exit 7 \(SystemExit\(7\)\)',
                   pod.log(0)), pod.log(0)
  # Worker 0 was stopped through its process group, not left to time out.
  assert (pod.logs / 'stop.log').exists()
  assert 'podrun: exit' in pod.log(0)
  assert not pod.processes()


def test_ctrl_c_stops_every_worker(tmp_path):
  pod = FakePod(tmp_path)
  started = time.monotonic()
  proc = pod.start('--', f'--config={helpers.PROBE_CONFIG}',
                   '--config.steps=100000', '--config.log_every=1',
                   '--local_devices=4', '--config.checkpointing=False',
                   f'--workdir={tmp_path / "work"}')
  try:
    assert helpers.wait_for(
        lambda: (pod.logs / 'worker_0.log').exists() and
        'step 2/' in pod.log(0), 120), 'the job never got going'
    os.kill(proc.pid, signal.SIGINT)
    result = helpers.finish(proc, 60, started)
    assert result.returncode == 130, result.output
    assert 'interrupted' in result.stderr
    assert helpers.wait_for(lambda: not pod.processes(), 20), (
        pod.processes())
  finally:
    helpers.kill_group(proc)
    pod.kill_leftovers()


def test_a_preempted_run_is_relaunched(tmp_path):
  pod = FakePod(tmp_path)
  workdir = tmp_path / 'work'
  result = pod.run(
      '--max_restarts=1', '--', f'--config={helpers.PROBE_CONFIG}',
      '--config.steps=30', '--config.fail_rank=1', '--config.fail_step=12',
      '--config.fail_code=75', '--config.fail_once=True',
      '--config.checkpoint_every=5', '--local_devices=4',
      f'--workdir={workdir}')
  assert result.returncode == 0, result.output
  assert 'relaunching (attempt 2 of 2) after exit code 75' in result.stderr
  assert '===== attempt 2 of job test-job =====' in pod.log(0)
  assert helpers.read_json(workdir / 'ranks' / 'rank_0.json')[
      'start_step'] == 10


HOSTILE = ['--config.note=a b "c" \'d\'', '$HOME', '`touch PWNED1`',
           '; touch PWNED2', '$(touch PWNED3)', "it's", 'tab\there', '*',
           '\\n', '&& touch PWNED4 ||', '']


def test_hostile_arguments_arrive_unchanged_and_unexecuted(tmp_path):
  pod = FakePod(tmp_path)
  note = 'x $(touch PWNED5) `touch PWNED6` "; touch PWNED7'
  args = pod.args('--env', f'NOTE={note}', '--', *HOSTILE)
  args[args.index(f'--worker_python={sys.executable}')] = (
      f'--worker_python={FAKE_BIN / "record_args"}')
  result = subprocess.run(args, cwd=helpers.REPO, env=pod.env,
                          capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  for w in range(2):
    home = pod.root / f'worker_{w}'
    received = (home / 'args.bin').read_bytes().split(b'\0')[:-1]
    assert [a.decode() for a in received] == ['-u', '-m', 'launcher',
                                              *HOSTILE]
    assert (home / 'note.txt').read_text() == note
  assert not list(tmp_path.rglob('PWNED*'))
  assert not list(helpers.REPO.glob('PWNED*'))


def test_dry_run_prints_the_exact_commands_and_runs_none(tmp_path):
  pod = FakePod(tmp_path)
  args = pod.args('--dry_run', '--env', 'A=b c', '--', *LINEAR,
                  '--config.note=x y')
  args.remove('--skip_preflight')
  args[args.index(f'--worker_python={sys.executable}')] = (
      '--worker_python=/opt/py thon/bin/python')
  result = subprocess.run(args, cwd=helpers.REPO, env=pod.env,
                          capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode == 0, result.stderr
  assert not pod.calls.exists() and not pod.root.exists()
  lines = result.stdout.splitlines()
  code_hash = lines[0].split('code sha256 ')[1].split(',')[0]
  short = code_hash[:16]
  logs = pod.logs
  expected = [
      f'# job test-job, code sha256 {code_hash}, logs in {logs}',
      '# preflight: python -m launcher.tpu_pod preflight --tpu=fake-pod '
      '--zone=zone-a --project=proj --wait_healthy=600 -- '
      '--config=configs/linear_regression.py --config.steps=30 '
      '--local_devices=4 --config.note=x\\ y',
      f'gcloud compute tpus tpu-vm scp {logs}/code.tar.gz '
      f'fake-pod:podrun-{short}.tar.gz --worker=all --zone=zone-a '
      '--project=proj',
      'gcloud compute tpus tpu-vm ssh fake-pod --worker=all --zone=zone-a '
      '--project=proj --command=set\\ -e\\;\\ d=\\"\\$HOME/podrun/code-'
      f'{short}\\"\\;\\ if\\ \\[\\ \\!\\ -f\\ \\"\\$d/.podrun-ready\\"\\ '
      '\\]\\;\\ then\\ rm\\ -rf\\ \\"\\$d\\"\\;\\ mkdir\\ -p\\ \\"\\$d\\"\\;'
      '\\ tar\\ -xzf\\ \\"\\$HOME/podrun-'
      f'{short}.tar.gz\\"\\ -C\\ \\"\\$d\\"\\;\\ touch\\ '
      '\\"\\$d/.podrun-ready\\"\\;\\ fi',
      'gcloud compute tpus tpu-vm ssh fake-pod --worker=all --zone=zone-a '
      '--project=proj --command=cd\\ \\"\\$HOME/podrun/code-'
      f'{short}\\"\\ \\&\\&\\ exec\\ bash\\ scripts/tpu_worker.sh\\ run\\ '
      'test-job\\ /opt/py\\\\\\ thon/bin/python\\ A=b\\\\\\ c\\ --\\ '
      '--config=configs/linear_regression.py\\ --config.steps=30\\ '
      '--local_devices=4\\ --config.note=x\\\\\\ y',
      '# on a failure or Ctrl-C:',
      'gcloud compute tpus tpu-vm ssh fake-pod --worker=all --zone=zone-a '
      '--project=proj --command=bash\\ \\"\\$HOME/podrun/code-'
      f'{short}/scripts/tpu_worker.sh\\"\\ stop\\ test-job\\ 5',
  ]
  assert lines == expected


def test_bad_arguments_exit_2_naming_them(tmp_path):
  pod = FakePod(tmp_path)
  for args, message in (
      ([SCRIPT, '--zone=z', '--', *LINEAR], '--tpu=NAME is required'),
      ([SCRIPT, '--tpu=t', '--zone=z'], 'give the launcher flags after --'),
      ([SCRIPT, '--tpu=t', '--zone=z', '--frobnicate', '--', *LINEAR],
       'unknown argument: --frobnicate'),
      ([SCRIPT, '--tpu=t', '--zone=z', '--env', 'A B=c', '--', *LINEAR],
       'expected KEY=VALUE with KEY a variable name'),
  ):
    result = subprocess.run(args, cwd=helpers.REPO, env=pod.env,
                            capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == exit_codes.CONFIG_ERROR, result.stderr
    assert message in result.stderr
  assert not pod.calls.exists()
