"""The workdir lease: taken, refused, taken over, renewed, released."""

import json
import time

import pytest

from launcher.process import lease as lease_lib
from runtime.common import files
from runtime.common import layout
from tests import helpers

pytestmark = pytest.mark.unit


def _holder(path):
  return json.loads((path / layout.LEASE).read_text())


def test_taken_and_released(tmp_path):
  lease = lease_lib.Lease([str(tmp_path), str(tmp_path / 'ckpt')], 'job-a')
  lease.acquire()
  assert _holder(tmp_path)['job_id'] == 'job-a'
  assert _holder(tmp_path / 'ckpt')['job_id'] == 'job-a'
  lease.release()
  assert not (tmp_path / layout.LEASE).exists()
  assert not (tmp_path / 'ckpt' / layout.LEASE).exists()


def test_a_live_lease_of_another_job_is_refused_naming_it(tmp_path):
  first = lease_lib.Lease([str(tmp_path)], 'job-a')
  first.acquire()
  try:
    with pytest.raises(lease_lib.WorkdirBusyError,
                       match=r'is in use by job job-a \(host \S+, pid \d+'):
      lease_lib.Lease([str(tmp_path)], 'job-b').acquire()
    assert _holder(tmp_path)['job_id'] == 'job-a'  # Untouched.
  finally:
    first.release()


def test_no_lease_is_kept_when_one_of_them_is_refused(tmp_path):
  other = lease_lib.Lease([str(tmp_path / 'ckpt')], 'job-a')
  other.acquire()
  try:
    with pytest.raises(lease_lib.WorkdirBusyError):
      lease_lib.Lease([str(tmp_path), str(tmp_path / 'ckpt')],
                      'job-b').acquire()
    assert not (tmp_path / layout.LEASE).exists()
  finally:
    other.release()


def test_a_stale_lease_and_a_lease_of_the_same_job_are_taken_over(tmp_path):
  stale = {
      'job_id': 'gone',
      'host': 'x',
      'pid': 1,
      'since': 0.0,
      'renewed': time.time() - 100,
      'token': 't'
  }
  (tmp_path / layout.LEASE).write_text(json.dumps(stale))
  lease = lease_lib.Lease([str(tmp_path)], 'job-b', stale_after_s=60)
  lease.acquire()
  assert _holder(tmp_path)['job_id'] == 'job-b'
  lease.release()
  fresh = dict(stale, job_id='job-c', renewed=time.time())
  (tmp_path / layout.LEASE).write_text(json.dumps(fresh))
  restart = lease_lib.Lease([str(tmp_path)], 'job-c')
  restart.acquire()  # An earlier attempt of the same job.
  assert _holder(tmp_path)['token'] == restart.holder.token
  restart.release()


def test_renewed_while_held_and_a_takeover_is_noticed(tmp_path):
  lost = []
  lease = lease_lib.Lease([str(tmp_path)],
                          'job-a',
                          renew_every_s=0.1,
                          on_lost=lost.append)
  lease.acquire()
  first = _holder(tmp_path)['renewed']
  # A renewal every 0.1 s; waited for rather than slept on, so that a
  # loaded machine that runs the renewing thread late cannot fail it.
  assert helpers.wait_for(lambda: _holder(tmp_path)['renewed'] > first, 30)
  taken = dict(_holder(tmp_path), job_id='thief', token='other')
  # The thief writes whole (as _write does) and, as a taker does, writes
  # again if a renewal that read before its write overwrote it after.
  deadline = time.monotonic() + 5
  while not lost and time.monotonic() < deadline:
    if _holder(tmp_path)['token'] != 'other':
      files.write_atomic(str(tmp_path / layout.LEASE), json.dumps(taken))
    time.sleep(0.05)
  lease.release()
  assert lost and 'lost the lease on' in lost[0] and 'job thief' in lost[0]
  assert _holder(tmp_path)['job_id'] == 'thief'  # Not removed by the loser.
