"""When the TPU driver stops waiting for a lost slice (launcher/tpu/ends.py).

Two slices of 2 workers: processes 0-1 on slice 0, 2-3 on slice 1 (lost).
The babysat and elastic fleet tests run the same rules against the
emulated service and the emulated bucket.
"""

import json
import threading

import pytest

from launcher.tpu import ends
from tests import helpers

PROCESSES = ['0', '1', '2', '3']
LOST = {'2', '3'}
URL = 'gs://runs/job'

pytestmark = pytest.mark.unit


def _over(exits, kept_in_bucket=False, final=(), url=''):
  return ends.over(exits, PROCESSES, LOST, kept_in_bucket, set(final), url)


def test_every_process_reported():
  assert _over({
      '0': 75,
      '1': 75,
      '2': 75,
      '3': 75
  }) == ("every process reported its job's end")


def test_not_until_the_other_slices_reported():
  assert _over({'0': 75}) is None
  assert _over({'0': 75}, kept_in_bucket=True, final=LOST, url=URL) is None


def test_the_others_ended_without_a_save():
  assert 'cannot save' in _over({'0': 10, '1': 137})


def test_the_others_saved_and_nothing_is_kept_in_a_bucket():
  assert 'goes with their disks' in _over({'0': 75, '1': 75})


def test_a_bucket_waits_for_every_lost_ledger():
  saved = {'0': 75, '1': 75}
  assert _over(saved, kept_in_bucket=True) is None
  assert _over(saved, kept_in_bucket=True, final={'2'}, url=URL) is None
  assert _over(
      saved, kept_in_bucket=True, final=LOST,
      url=URL) == (f'the lost processes 2, 3 wrote their last ledgers to {URL}')


def test_one_saved_one_failed_waits():
  # Mixed ends say neither that a save happened everywhere nor that none
  # could: the ceiling decides.
  assert _over({'0': 75, '1': 10}) is None


def test_one_slice_lost_whole():
  one = ['0', '1']
  assert ends.over({}, one, set(one), True, set(one),
                   URL).startswith('the lost processes 0, 1')
  assert ends.over({}, one, set(one), False, set(), '') is None


class _Bucket:
  """gcsfs's `cat` over a dict: {path without gs://: bytes}."""

  def __init__(self):
    self.objects = {}
    self.reads = 0
    self.read = threading.Event()

  def cat(self, paths, on_error):
    assert on_error == 'omit'
    self.reads += 1
    self.read.set()
    return {
        p[len('gs://'):]: self.objects[p[len('gs://'):]]
        for p in paths
        if p[len('gs://'):] in self.objects
    }


def _ledger(final):
  return json.dumps({'final': final, 'parts': {}}).encode()


def test_ledgers_are_read_until_every_one_is_final(monkeypatch):
  monkeypatch.setattr(ends, 'POLL_S', 0.01)
  bucket = _Bucket()
  prefix = 'runs/job/goodput/job-a1'
  bucket.objects[f'{prefix}/rank_2.json'] = _ledger(True)
  bucket.objects[f'{prefix}/rank_3.json'] = _ledger(False)
  ledgers = ends.Ledgers(URL + '/', 'job-a1', [2, 3],
                         fs_factory=lambda: bucket).start()
  try:
    assert bucket.read.wait(30)
    assert helpers.wait_for(lambda: ledgers.final() == {'2'}, 30, 0.01)
    bucket.objects[f'{prefix}/rank_3.json'] = _ledger(True)
    assert helpers.wait_for(lambda: ledgers.final() == {'2', '3'}, 30, 0.01)
    reads = bucket.reads
    ledgers._thread.join(30)  # pylint: disable=protected-access
    assert not ledgers._thread.is_alive()  # pylint: disable=protected-access
    assert bucket.reads == reads  # Done: no more reads.
  finally:
    ledgers.stop()


def test_an_unreachable_bucket_never_ends_the_wait(monkeypatch):
  monkeypatch.setattr(ends, 'POLL_S', 0.01)

  class Unreachable:
    calls = 0

    def cat(self, paths, on_error):
      Unreachable.calls += 1
      raise OSError('connection refused')

  ledgers = ends.Ledgers(URL, 'job-a1', [2, 3], fs_factory=Unreachable).start()
  assert helpers.wait_for(lambda: Unreachable.calls >= 3, 30, 0.01)
  assert ledgers.final() == set()
  ledgers.stop()
  ledgers._thread.join(30)  # pylint: disable=protected-access
  assert not ledgers._thread.is_alive()  # pylint: disable=protected-access


def test_no_gcsfs_means_no_early_end():

  def missing():
    raise RuntimeError('a gs:// workdir needs gcsfs')

  ledgers = ends.Ledgers(URL, 'job-a1', [2], fs_factory=missing).start()
  ledgers._thread.join(30)  # pylint: disable=protected-access
  assert ledgers.final() == set()
