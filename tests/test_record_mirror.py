"""A bucket's workdir mirrored from local disk
(launcher/common/record_mirror.py).

Against an in-memory bucket with the calls the mirror makes of gcsfs
(find with details, cat_file, pipe_file) and the fields GCS gives
(md5Hash, updated); tests/test_buckets.py runs it against fake-gcs-server.
"""

import base64
import datetime
import hashlib
import os
import threading
import time

import pytest

from launcher.common import record_mirror
from runtime.common import layout

pytestmark = pytest.mark.unit

URL = 'gs://runs/job'


class Bucket:
  """Objects by name ('runs/job/metrics.jsonl'), each with its write time."""

  def __init__(self):
    self.objects: dict[str, tuple[bytes, float]] = {}
    self.writes: list[str] = []
    self.failing = False
    self.hang = threading.Event()

  def find(self, url, detail=True):
    assert detail
    prefix = url[len('gs://'):]
    return {
        name: self._info(name)
        for name in self.objects
        if name.startswith(prefix + '/')
    }

  def _info(self, name):
    data, written = self.objects[name]
    stamp = datetime.datetime.fromtimestamp(written, datetime.timezone.utc)
    return {
        'name': name,
        'size': len(data),
        'md5Hash': base64.b64encode(hashlib.md5(data).digest()).decode(),
        'updated': stamp.strftime('%Y-%m-%dT%H:%M:%S.%fZ')
    }

  def cat_file(self, url):
    return self.objects[url[len('gs://'):]][0]

  def pipe_file(self, url, data):
    if self.hang.is_set():
      time.sleep(3)
    if self.failing:
      raise OSError('connection refused')
    self.objects[url[len('gs://'):]] = (bytes(data), time.time())
    self.writes.append(url[len(URL) + 1:])

  def put(self, relative, data, written=None):
    self.objects[f'runs/job/{relative}'] = (data, written or time.time())


def _write(root, relative, data: bytes, mtime=None):
  path = os.path.join(root, relative)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(data)
  if mtime is not None:
    os.utime(path, (mtime, mtime))
  return path


def _mirror(tmp_path, bucket, owns=None, job_id=None):
  return record_mirror.Mirror(URL,
                              str(tmp_path / 'copy'),
                              owns or record_mirror.process_owns(0),
                              fs=bucket,
                              job_id=job_id)


def test_each_file_has_one_owner():
  zero, one = record_mirror.process_owns(0), record_mirror.process_owns(1)
  for relative in ('metrics.jsonl', 'run.json',
                   'tensorboard/events.out.tfevents.1.host'):
    assert zero(relative) and not one(relative), relative
  for relative in ('ranks/rank_1.json', 'stall/rank_1.json',
                   'goodput/abc-a2/rank_1.json', 'goodput/abc-a2/rank_1.step'):
    assert one(relative) and not zero(relative), relative
  for relative in ('summary.json', 'goodput.jsonl', 'logs/attempts.jsonl',
                   'logs/job.json'):
    assert record_mirror.launcher_owns(relative)
    assert not zero(relative) and not one(relative), relative
  assert not record_mirror.launcher_owns('logs/rank_0.log')


def test_a_push_uploads_what_changed_and_only_what_this_process_owns(tmp_path):
  bucket = Bucket()
  mirror = _mirror(tmp_path, bucket)
  copy = tmp_path / 'copy'
  _write(copy, 'metrics.jsonl', b'{"step": 1}\n')
  _write(copy, 'ranks/rank_1.json', b'{}')  # Process 1's.
  _write(copy, 'logs/rank_0.log', b'a log')  # The launcher's, never.
  _write(copy, 'checkpoints/10/x', b'orbax writes these itself')
  _write(copy, '.podrun/join/rank_0.json', b'{}')
  assert mirror.push() == ['metrics.jsonl']
  assert mirror.push() == []  # Nothing changed.
  with open(copy / 'metrics.jsonl', 'ab') as f:
    f.write(b'{"step": 2}\n')
  assert mirror.push() == ['metrics.jsonl']
  assert bucket.cat_file(f'{URL}/metrics.jsonl') == (
      b'{"step": 1}\n{"step": 2}\n')


def test_a_small_file_changed_in_place_is_seen_without_its_mtime(tmp_path):
  # The ledger's high-water step is written through a memory map.
  bucket = Bucket()
  mirror = _mirror(tmp_path, bucket)
  path = _write(tmp_path / 'copy', 'goodput/a1/rank_0.step', bytes(8), 1000)
  assert mirror.push() == ['goodput/a1/rank_0.step']
  with open(path, 'r+b') as f:
    f.write((7).to_bytes(8, 'little'))
  os.utime(path, (1000, 1000))
  assert mirror.push() == ['goodput/a1/rank_0.step']


def test_a_fetch_brings_the_earlier_attempts_and_keeps_newer_local_files(
    tmp_path):
  bucket = Bucket()
  bucket.put('metrics.jsonl', b'{"step": 1}\n', written=time.time() - 100)
  bucket.put('goodput/a1/rank_1.json',
             b'{"end": null}',
             written=time.time() - 100)
  bucket.put('checkpoints/10/x', b'not the record')
  copy = tmp_path / 'copy'
  # Written here after the last upload: an obituary's end of process 1.
  _write(copy, 'goodput/a1/rank_1.json', b'{"end": 137}')
  mirror = _mirror(tmp_path, bucket, owns=record_mirror.process_owns(1))
  assert mirror.fetch() == 2
  assert (copy / 'metrics.jsonl').read_bytes() == b'{"step": 1}\n'
  assert (copy / 'goodput/a1/rank_1.json').read_bytes() == b'{"end": 137}'
  assert not (copy / 'checkpoints').exists()
  # The fetched file matches the bucket; the newer local one goes up.
  assert mirror.push() == ['goodput/a1/rank_1.json']
  assert bucket.cat_file(f'{URL}/goodput/a1/rank_1.json') == b'{"end": 137}'


def test_a_fetch_replaces_an_older_local_copy(tmp_path):
  bucket = Bucket()
  copy = tmp_path / 'copy'
  _write(copy, 'metrics.jsonl', b'{"step": 1}\n', mtime=time.time() - 100)
  bucket.put('metrics.jsonl', b'{"step": 1}\n{"step": 2}\n')
  mirror = _mirror(tmp_path, bucket)
  mirror.fetch()
  assert (copy / 'metrics.jsonl').read_bytes() == b'{"step": 1}\n{"step": 2}\n'
  assert mirror.push() == []  # What it fetched is what the bucket has.


def _earlier_job(tmp_path, bucket, job_id='job-a'):
  """A job's record uploaded from this machine's copy."""
  mirror = _mirror(tmp_path, bucket, job_id=job_id)
  mirror.fetch()
  copy = tmp_path / 'copy'
  _write(copy, 'goodput/a-a1/rank_0.jsonl', b'{"startup": 1}\n')
  _write(copy, 'device_batch_limit.json', b'{"limit": 4}')
  _write(copy, '.podrun_lease.json', b'{"job_id": "job-a"}')
  assert mirror.push()
  return copy


def test_a_copy_whose_record_was_deleted_is_set_aside(tmp_path, caplog):
  bucket = Bucket()
  copy = _earlier_job(tmp_path, bucket)
  bucket.objects.clear()  # The user deletes the run, then starts afresh.
  mirror = _mirror(tmp_path, bucket, job_id='job-b')
  assert mirror.fetch() == 0
  # Nothing of job-a's is read or uploaded as job-b's.
  assert not (copy / 'goodput').exists()
  assert not (copy / 'device_batch_limit.json').exists()
  assert mirror.push() == []
  aside, = tmp_path.glob('copy.set-aside-*')
  assert (aside / 'goodput/a-a1/rank_0.jsonl').exists()  # Kept, not lost.
  assert 'holds 3 file(s) the bucket does not' in caplog.text
  assert f'of job job-a, not of this one (job-b): it is set aside in {aside}' in (
      caplog.text)


def test_another_records_copy_is_set_aside_and_the_buckets_fetched(tmp_path):
  bucket = Bucket()
  copy = _earlier_job(tmp_path, bucket)
  bucket.objects.clear()
  bucket.put('metrics.jsonl', b'{"step": 1}\n')  # Job c's, from elsewhere.
  _mirror(tmp_path, bucket, job_id='job-b').fetch()
  assert sorted(
      p.relative_to(copy).as_posix()
      for p in copy.rglob('*')
      if p.is_file()) == ['.podrun/copy_of.json', 'metrics.jsonl']


def test_a_later_attempt_of_the_same_job_keeps_what_it_wrote(tmp_path):
  """Before its first upload the bucket lacks it: a restart of the same job
  on this machine uploads it then."""
  bucket = Bucket()
  _mirror(tmp_path, bucket, job_id='job-a').fetch()
  copy = tmp_path / 'copy'
  _write(copy, 'goodput/a-a1/rank_0.jsonl', b'{"startup": 1}\n')
  again = _mirror(tmp_path, bucket, job_id='job-a')
  again.fetch()
  assert again.push() == ['goodput/a-a1/rank_0.jsonl']
  assert not list(tmp_path.glob('copy.set-aside-*'))


def test_a_new_job_resuming_the_same_record_keeps_the_copy(tmp_path):
  """Every file of the copy is in the bucket: it is that record's."""
  bucket = Bucket()
  copy = _earlier_job(tmp_path, bucket)
  _mirror(tmp_path, bucket, job_id='job-b').fetch()
  assert not list(tmp_path.glob('copy.set-aside-*'))
  assert (copy / 'device_batch_limit.json').exists()


def test_without_a_job_id_the_copy_is_taken_as_it_is(tmp_path):
  bucket = Bucket()
  copy = _earlier_job(tmp_path, bucket)
  bucket.objects.clear()
  _mirror(tmp_path, bucket).fetch()
  assert (copy / 'device_batch_limit.json').exists()


def test_a_failed_upload_is_named_and_tried_again(tmp_path, caplog):
  bucket = Bucket()
  mirror = _mirror(tmp_path, bucket)
  _write(tmp_path / 'copy', 'run.json', b'{}')
  bucket.failing = True
  assert mirror.push() == []
  assert mirror.unwritten == {'run.json'}
  assert 'cannot write gs://runs/job/run.json' in caplog.text
  assert not mirror.finish(timeout_s=5)
  assert 'gs://runs/job misses run.json' in caplog.text
  bucket.failing = False
  assert mirror.push() == ['run.json']
  assert mirror.unwritten == set()


def test_the_last_upload_is_bounded(tmp_path, caplog):
  bucket = Bucket()
  mirror = _mirror(tmp_path, bucket)
  _write(tmp_path / 'copy', 'run.json', b'{}')
  bucket.hang.set()
  started = time.monotonic()
  assert not mirror.finish(timeout_s=0.5)
  assert time.monotonic() - started < 30
  assert 'the record did not reach gs://runs/job within 0.5 s' in caplog.text


def test_the_local_copy_is_named_by_the_bucket_path(monkeypatch, tmp_path):
  monkeypatch.setenv('PODRUN_RECORD_CACHE', str(tmp_path))
  assert layout.local_copy('gs://runs/a/b/') == str(tmp_path / 'runs' / 'a' /
                                                    'b')
  assert layout.in_bucket('gs://runs/a')
  assert not layout.in_bucket('/runs/a')


def test_a_json_lines_file_goes_up_to_its_last_whole_line(tmp_path):
  bucket = Bucket()
  mirror = _mirror(tmp_path, bucket)
  path = _write(tmp_path / 'copy', 'metrics.jsonl', b'{"step": 1}\n{"st')
  assert mirror.push() == ['metrics.jsonl']
  assert bucket.cat_file(f'{URL}/metrics.jsonl') == b'{"step": 1}\n'
  with open(path, 'ab') as f:
    f.write(b'ep": 2}\n')
  assert mirror.push() == ['metrics.jsonl']
  assert bucket.cat_file(f'{URL}/metrics.jsonl') == (
      b'{"step": 1}\n{"step": 2}\n')
