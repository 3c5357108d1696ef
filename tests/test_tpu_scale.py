"""scripts/launch_tpu_pod.sh on 64 emulated workers (a v4-512 slice).

Each worker's job is tests/fake_gcloud/standin_job, a shell loop rather
than JAX, so that 64 of them fit on one machine. gcloud runs ssh sessions
16 at a time here unless told otherwise (its --batch-size; 64 in the real
SDK), so a launch that left batching to gcloud would never start workers
16-63 of a job that does not end.

The times are printed (pytest -s), not asserted: they are the machine's.
"""

import re
import time

import pytest

from tests import helpers
from tests import tpu_emulation

pytestmark = [pytest.mark.processes, pytest.mark.timeout(400)]

WORKERS = 64


def _all_logs_show(pod, text: str) -> bool:
  try:
    return all(text in pod.log(w) for w in range(WORKERS))
  except FileNotFoundError:
    return False


def test_64_workers_start_report_and_stop_on_the_first_failure(tmp_path):
  """About 40 s: three rounds of 64 emulated ssh sessions, each starting the
  worker half of the launcher (Python) on its VM; one test of the scale."""
  pod = tpu_emulation.FakePod(tmp_path,
                              workers=WORKERS,
                              FAKE_GCLOUD_BATCH_SIZE='16')
  fail_file = tmp_path / 'fail_now'
  standin = str(tpu_emulation.FAKE_BIN / 'standin_job')
  launched = time.monotonic()
  proc = pod.start('--',
                   '--standin.fail_process=37',
                   f'--standin.fail_when={fail_file}',
                   python=standin)
  try:
    helpers.wait_for(
        lambda: _all_logs_show(pod, 'step 1\n') or proc.poll() is not None, 200)
    if proc.poll() is not None:
      raise AssertionError('the launch ended before every worker started:\n' +
                           helpers.finish(proc, 10, launched).output[-5000:])
    assert _all_logs_show(pod, 'step 1\n'), 'not every worker started'

    all_started = time.monotonic() - launched
    asked = time.monotonic()
    status = pod.run('--status', job_id='', timeout=200)
    status_s = time.monotonic() - asked
    assert status.returncode == 0, status.output
    running = re.findall(r'^\[worker (\d+)\] podrun: job test-job-a1: running',
                         status.stdout, re.M)
    assert sorted(map(int, running)) == list(range(WORKERS))
    fail_file.write_text('')
    failed = time.monotonic()
    result = helpers.finish(proc, 200, launched)
    assert helpers.wait_for(lambda: not pod.processes(), 120), (pod.processes())
    all_stopped = time.monotonic() - failed
  finally:
    helpers.kill_group(proc)
    pod.kill_leftovers()
  assert result.returncode == 7, result.output
  assert 'worker 37 exited 7 first' in result.stderr
  for w in range(WORKERS):
    assert re.search(r'podrun: exit (7|143)\n$', pod.log(w)), pod.log(w)[-300:]
  # The console: worker 0 in full, the others' errors only; every line in
  # the worker's log.
  assert '[worker 0] standin: process 0 step 2' in result.stdout
  assert '[worker 37] standin: process 37 fails on purpose (error)' in (
      result.stdout)
  assert '[worker 37] standin: process 37 step' not in result.stdout
  assert 'standin: process 37 step 2' in pod.log(37)
  batches = [
      c for c in pod.gcloud_calls()
      if c[3] == 'ssh' and any(a.startswith('--command=cd ') for a in c)
  ]
  assert all(f'--batch-size={WORKERS}' in c for c in batches), batches
  print(f'\n64 workers: launch to all started {all_started:.1f} s, --status '
        f'{status_s:.1f} s, first failure to all stopped {all_stopped:.1f} s')
