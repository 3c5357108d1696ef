"""launcher/tpu/worker.py's place across slices and worker_accelerator.py's
check, in this process: no gcloud, no job."""

import argparse
import os
import subprocess
import sys

import pytest

from launcher.tpu import worker
from launcher.tpu import worker_accelerator
from launcher.common import output_prefix

pytestmark = pytest.mark.unit


def _args(**values):
  defaults = dict(slice_id=0,
                  num_slices=1,
                  expected_processes=0,
                  accelerator_devices='',
                  kill_accelerator_holders=False,
                  replace=False,
                  stop_grace=5.0)
  return argparse.Namespace(**{**defaults, **values})


def test_the_process_id_runs_across_slices(monkeypatch):
  monkeypatch.setenv('PODRUN_PROCESS_ID', '1')  # Worker 1 of its slice.
  assert worker.global_id(_args()) == '1'
  args = _args(slice_id=2, num_slices=3, expected_processes=12)
  assert worker.global_id(args) == '9'  # 2 x 4 + 1.
  env = worker.multislice_env(args,
                              {'MEGASCALE_COORDINATOR_ADDRESS': '10.0.0.2'})
  assert env == {
      'PODRUN_PROCESS_ID': '9',
      'PODRUN_NUM_PROCESSES': '12',
      'PODRUN_COORDINATOR_ADDRESS': '10.0.0.2:8476'
  }
  # A VM that names the coordinator itself keeps it.
  assert 'PODRUN_COORDINATOR_ADDRESS' not in worker.multislice_env(
      args, {'PODRUN_COORDINATOR_ADDRESS': '127.0.0.1:5000'})
  assert worker.multislice_env(_args(), {}) == {}


def test_holders_and_a_stale_lockfile_are_named(tmp_path, monkeypatch, capsys):
  device = tmp_path / 'accel0'
  device.write_bytes(b'')
  lockfile = tmp_path / 'libtpu_lockfile'
  monkeypatch.setenv(worker_accelerator.LOCKFILE_ENV, str(lockfile))
  holder = subprocess.Popen([
      sys.executable, '-c', 'import sys, time; f = open(sys.argv[1]); '
      'print(1, flush=True); time.sleep(60)',
      str(device)
  ],
                            stdout=subprocess.PIPE)
  try:
    holder.stdout.readline()  # It has the file open.
    assert worker_accelerator.holders({str(device)}) == {
        holder.pid: [str(device)]
    }
    devices = str(tmp_path / 'accel*')
    assert not worker_accelerator.check('3', devices, grace=5)
    out = capsys.readouterr().out
    assert f'[worker 3] podrun: the accelerator is busy: pid {holder.pid}' in (
        out)
    assert holder.poll() is None
    assert worker_accelerator.check('3', devices, kill_holders=True, grace=5)
    assert holder.wait(timeout=10) is not None
  finally:
    holder.kill()
    holder.wait()
  lockfile.write_text('')
  assert not worker_accelerator.check('3', '', grace=5)
  assert 'a stale libtpu lockfile' in capsys.readouterr().out
  assert worker_accelerator.check('3', '', remove_stale_lockfile=True, grace=5)
  assert not os.path.exists(lockfile)


@pytest.mark.parametrize('line,shown', [
    ('[rank 3/64] W1201 12:00:00.1 x.py:1] slow step', True),
    ('[rank 3/64] I1201 12:00:00.1 x.py:1] step 5/100', False),
    ('Traceback (most recent call last):', True),
    ('standin: process 37 fails on purpose (error)', True),
    ('podrun: the accelerator is busy: pid 7', True),
    ('standin: process 3 step 4', False),
])
def test_which_lines_of_other_workers_reach_the_console(line, shown):
  assert output_prefix.alarming(line) == shown


def test_gone_tells_the_job_which_processes_went(tmp_path, monkeypatch, capsys):
  from launcher.process import peers  # pylint: disable=g-import-not-at-top
  from runtime.common import handoff  # pylint: disable=g-import-not-at-top
  assert worker.GONE_FILE_VAR == handoff.GONE_FILE
  monkeypatch.setattr(worker, 'JOBS_DIR', str(tmp_path))
  monkeypatch.setenv('PODRUN_PROCESS_ID', '0')
  assert worker.main(
      ['gone', 'job-a2', '--processes=3,2', '--why=node n-1 PREEMPTED']) == 0
  assert 'job job-a2 never ran here' in capsys.readouterr().out
  os.makedirs(tmp_path / 'job-a2')
  assert worker.main(
      ['gone', 'job-a2', '--processes=3,2', '--why=node n-1 PREEMPTED']) == 0
  assert ('told job job-a2 that processes 2, 3 are gone'
          in capsys.readouterr().out)
  # What the job's processes read back (launcher/process/peers.py).
  assert peers.gone(str(tmp_path / 'job-a2' / 'gone')) == peers.Gone(
      frozenset({2, 3}), 'node n-1 PREEMPTED')
