"""A workdir in a bucket: written on local disk, mirrored to gs:// whole.

Object storage has no append, and the record's writers append (metrics.jsonl,
the goodput ledgers, TensorBoard's event files). So a job run with
`--workdir=gs://BUCKET/RUN` writes its record to a local copy
(runtime/common/layout.py's `Record.of` decides where), and each process
keeps the bucket in step with a `Mirror`: at its start it fetches what
earlier attempts left in the bucket (the newer of two copies wins), then it
uploads the files it owns whole, when they changed, every `PUSH_EVERY_S`
seconds and once more at its end.
A reader (scripts/goodput.py, scripts/plot_metrics.py) fetches the record
the same way, so it sees every attempt; the TensorBoard event files are in
the bucket too, each uploaded whole.

A copy belongs to one record. It remembers the job that last used it
(.podrun/copy_of.json); a job that is not that one, finding in the copy
files the bucket does not hold (the bucket's record was deleted, or is
another's), sets the copy aside (renamed, kept on disk, said on the
console) and starts from the bucket's, so that no ledger, learned batch
limit or lease of an earlier record is read or uploaded as its own. Every
attempt of one job shares its id (PODRUN_JOB_ID, or SLURM's), so a restart
on the same machine keeps what it wrote before the bucket had it.

Each uploads the files it writes, as runtime/common/layout.py says (`owner`):
process i its `rank_<i>.*`, process 0 the rest of the record, the launcher
its own files (process 0 too where no launcher reaches the workdir: a
cluster's job, or a TPU VM's on its own disk; a TPU or Ray driver adds its
attempts, the roll-up over them and logs/job.json to a bucket's record
after its last attempt, launcher_record.py). What is never mirrored, and
why: `layout.NEVER_MIRRORED`.

JAX-free: the launcher's side runs it too. gcsfs is imported only for a
bucket (the `gcs` and `tpu` extras install it).

Example:
  >>> record = layout.Record.of('gs://runs/mnist')
  >>> mirror = Mirror(record.bucket, record.workdir,
  ...                 owns=process_owns(0))
  >>> mirror.fetch()          # the record of earlier attempts, if any
  >>> mirror.start()          # uploads every PUSH_EVERY_S
  >>> ...                     # the job writes to mirror.local_dir
  >>> mirror.finish()         # the last upload
"""

import base64
import calendar
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from typing import Callable, Optional

from absl import logging

from runtime.common import handoff
from runtime.common import gcs_auth
from runtime.common import layout

PUSH_EVERY_S = 10.0
# The end's upload may not hold up a process that is being preempted.
FINISH_TIMEOUT_S = 30.0
# Small files are compared by content: a memory-mapped write (the ledger's
# high-water step) need not change the file's mtime.
_ALWAYS_COMPARE_BYTES = 4096


def process_owns(process_index: int,
                 launcher_record: bool = True) -> Callable[[str], bool]:
  """Which record files process `process_index` uploads: those it writes
  (`layout.writer`); paths are relative to the workdir, with '/'.

  Args:
    process_index: the process.
    launcher_record: whether a launcher writes its own files of the record
      (PODRUN_LAUNCHER_RECORD); where none does, process 0 writes and
      uploads them (a cluster's or a TPU VM's process: goodput.jsonl).
  """
  return lambda relative: layout.writer(relative, launcher_record
                                       ) == process_index


def launcher_owns(relative: str) -> bool:
  """Which record files the launcher uploads: those it writes that a
  bucket's copy holds (not the processes' logs)."""
  return (layout.owner(relative) == layout.LAUNCHER and
          layout.mirrored(relative))


def bucket_fs():
  """gcsfs's file system for gs:// URLs (gcs_auth.filesystem)."""
  return gcs_auth.filesystem()


def _md5(data: bytes) -> str:
  return base64.b64encode(hashlib.md5(data).digest()).decode()


def _object_time(info: dict) -> float:
  """An object's last write, in seconds since the epoch."""
  updated = info.get('updated', '')
  stamp = time.strptime(updated[:19], '%Y-%m-%dT%H:%M:%S')
  fraction = re.match(r'\.(\d+)', updated[19:])
  return calendar.timegm(stamp) + (float('0.' + fraction.group(1))
                                   if fraction else 0.0)


class Mirror:
  """One process's copy of a bucket's workdir and its uploads.

  Attributes:
    url: the workdir, gs://BUCKET/PATH.
    local_dir: where this machine's processes write the record.
    unwritten: files whose last upload failed, relative to the workdir.
  """

  def __init__(self,
               url: str,
               local_dir: str,
               owns: Callable[[str], bool],
               fs=None,
               job_id: Optional[str] = None):
    """`job_id`: the job this process is of (launcher/common/cluster.py);
    None where none is known, and then the copy is taken as it is."""
    self.url = url.rstrip('/')
    self.local_dir = local_dir
    self.job_id = job_id
    self._owns = owns
    self._fs = fs
    self._uploaded: dict[str, tuple[tuple[int, int], str]] = {}
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self.unwritten: set[str] = set()

  @property
  def fs(self):
    if self._fs is None:
      self._fs = bucket_fs()
    return self._fs

  def _local(self, relative: str) -> str:
    return os.path.join(self.local_dir, *relative.split('/'))

  def _objects(self) -> dict[str, dict]:
    """{relative path: object info} of the record in the bucket."""
    prefix = self.url[len('gs://'):] + '/'
    found = self.fs.find(self.url, detail=True)
    return {
        name[len(prefix):]: info
        for name, info in found.items()
        if name.startswith(prefix) and layout.mirrored(name[len(prefix):])
    }

  def fetch(self) -> int:
    """Copies to local disk each object newer than its local copy, and
    counts the local copies that match the bucket as uploaded; returns
    how many objects the bucket held."""
    objects = self._objects()
    if self.job_id is not None:
      self._claim_copy(objects)
    for relative, info in objects.items():
      path = self._local(relative)
      local = _read(path)
      if local is not None and _md5(local) == info.get('md5Hash'):
        self._uploaded[relative] = (_signature(path), info['md5Hash'])
        continue
      if local is not None and os.stat(path).st_mtime > _object_time(info):
        continue  # Written here since (an obituary's end): ours to upload.
      data = self.fs.cat_file(f'{self.url}/{relative}')
      os.makedirs(os.path.dirname(path), exist_ok=True)
      tmp = f'{path}.tmp{os.getpid()}'
      with open(tmp, 'wb') as f:
        f.write(data)
      os.utime(tmp, (time.time(), _object_time(info)))
      os.replace(tmp, path)
      self._uploaded[relative] = (_signature(path), _md5(data))
    return len(objects)

  def _claim_copy(self, objects: dict[str, dict]) -> None:
    """Makes the local copy this job's: set aside when another job left in
    it files the bucket does not hold. Under a lock, for the processes of
    one machine that fetch at once."""
    os.makedirs(os.path.dirname(self.local_dir) or '.', exist_ok=True)
    with open(self.local_dir.rstrip(os.sep) + '.lock', 'a') as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      owner = self._local(layout.COPY_OF.replace(os.sep, '/'))
      held_by = _read_json(owner).get('job_id')
      extra = sorted(set(self._local_files()) - set(objects))
      if extra and held_by != self.job_id:
        aside = (f'{self.local_dir.rstrip(os.sep)}.set-aside-'
                 f'{time.strftime("%Y%m%d-%H%M%S")}-{os.getpid()}')
        os.replace(self.local_dir, aside)
        logging.warning(
            "this machine's copy of %s holds %d file(s) the bucket does not "
            '(%s%s) of job %s, not of this one (%s): it is set aside in %s, '
            "and the record starts from the bucket's", self.url, len(extra),
            ', '.join(extra[:3]), ', ...' if len(extra) > 3 else '', held_by or
            'unknown', self.job_id, aside)
      if held_by != self.job_id:
        os.makedirs(os.path.dirname(owner), exist_ok=True)
        tmp = f'{owner}.tmp{os.getpid()}'
        with open(tmp, 'w') as f:
          json.dump({'url': self.url, 'job_id': self.job_id}, f)
        os.replace(tmp, owner)

  def _local_files(self) -> list[str]:
    """The copy's files that a bucket's record holds, relative, with '/'."""
    out = []
    for directory, _, names in os.walk(self.local_dir):
      for name in names:
        relative = os.path.relpath(os.path.join(directory, name),
                                   self.local_dir).replace(os.sep, '/')
        if layout.mirrored(relative):
          out.append(relative)
    return out

  def push(self) -> list[str]:
    """Uploads, whole, each owned file that changed since its last upload;
    returns their paths relative to the workdir."""
    with self._lock:
      sent = []
      for relative in self._owned_files():
        path = self._local(relative)
        signature = _signature(path)
        known = self._uploaded.get(relative)
        if (known and known[0] == signature and
            signature[1] > _ALWAYS_COMPARE_BYTES and
            relative not in self.unwritten):
          continue
        data = _whole_lines(relative, _read(path))
        if data is None or (known and known[1] == _md5(data) and
                            relative not in self.unwritten):
          continue
        try:
          self.fs.pipe_file(f'{self.url}/{relative}', data)
        except Exception as e:  # pylint: disable=broad-except
          if relative not in self.unwritten:
            logging.warning(
                'cannot write %s/%s (%s); it stays in %s and the '
                'next upload tries again', self.url, relative, e, path)
          self.unwritten.add(relative)
          continue
        self.unwritten.discard(relative)
        self._uploaded[relative] = (signature, _md5(data))
        sent.append(relative)
      return sent

  def _owned_files(self) -> list[str]:
    out = []
    for directory, subdirs, names in os.walk(self.local_dir):
      if directory == self.local_dir:  # logs/ holds launcher files.
        subdirs[:] = [
            d for d in subdirs
            if d + '/' not in layout.NEVER_MIRRORED or d == layout.LOGS
        ]
      for name in names:
        relative = os.path.relpath(os.path.join(directory, name),
                                   self.local_dir).replace(os.sep, '/')
        if layout.mirrored(relative) and self._owns(relative):
          out.append(relative)
    # The ledgers last: a final ledger in the bucket tells the TPU driver
    # that the process's last upload is complete (launcher/tpu/ends.py).
    return sorted(out, key=lambda r: (r.startswith(layout.LEDGERS + '/'), r))

  def start(self, every_s: Optional[float] = None) -> None:
    """Uploads every `every_s` seconds (default $PODRUN_RECORD_UPLOAD_EVERY_S,
    else PUSH_EVERY_S) from a thread of its own."""
    every_s = (every_s or handoff.Settings.read().record_upload_every_s or
               PUSH_EVERY_S)

    def loop():
      while not self._stop.wait(every_s):
        try:
          self.push()
        except Exception as e:  # pylint: disable=broad-except
          logging.warning('the upload of %s failed: %s', self.url, e)

    self._thread = threading.Thread(target=loop,
                                    name='record-mirror',
                                    daemon=True)
    self._thread.start()

  def finish(self, timeout_s: float = FINISH_TIMEOUT_S) -> bool:
    """The last upload, bounded by `timeout_s`; False (after a warning
    naming what is missing) when some file did not reach the bucket."""
    self._stop.set()
    done = threading.Event()

    def last():
      try:
        self.push()
      finally:
        done.set()

    threading.Thread(target=last, name='record-mirror-end', daemon=True).start()
    if not done.wait(timeout_s):
      logging.warning(
          'the record did not reach %s within %g s; this '
          "machine's copy is in %s", self.url, timeout_s, self.local_dir)
      return False
    if self.unwritten:
      logging.warning('%s misses %s; this machine\'s copy is in %s', self.url,
                      ', '.join(sorted(self.unwritten)), self.local_dir)
      return False
    return True


def _whole_lines(relative: str, data: Optional[bytes]) -> Optional[bytes]:
  """A JSON-lines file up to its last complete line: a reader of the
  bucket never gets half a record."""
  if data is None or not relative.endswith('.jsonl'):
    return data
  return data[:data.rfind(b'\n') + 1]


def _signature(path: str) -> tuple[int, int]:
  stat = os.stat(path)
  return (stat.st_mtime_ns, stat.st_size)


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      value = json.load(f)
  except (OSError, ValueError):
    return {}
  return value if isinstance(value, dict) else {}


def _read(path: str) -> Optional[bytes]:
  try:
    with open(path, 'rb') as f:
      return f.read()
  except OSError:
    return None


_current: Optional[Mirror] = None


def use(mirror: Optional[Mirror]) -> None:
  """Makes `mirror` this process's, for `finish_current`."""
  global _current
  _current = mirror


def finish_current() -> None:
  """The last upload of this process's mirror, if it has one: called on
  every way out, also those that skip `finally` (os._exit)."""
  if _current is not None:
    _current.finish()


def merge_lines(url: str, relative: str, path: str, fs=None) -> None:
  """Appends to object URL/RELATIVE the lines of local file `path` that it
  lacks (a launcher on another machine may have written others)."""
  fs = fs or bucket_fs()
  target = f'{url.rstrip("/")}/{relative}'
  try:
    have = fs.cat_file(target).decode().splitlines()
  except FileNotFoundError:
    have = []
  with open(path) as f:
    ours = [line for line in f.read().splitlines() if line.strip()]
  known = set(have)
  merged = have + [line for line in ours if line not in known]
  if merged != have:
    fs.pipe_file(target, ('\n'.join(merged) + '\n').encode())


def fetch_record(url: str,
                 into: Optional[str] = None,
                 job_id: Optional[str] = None) -> str:
  """Copies a bucket's workdir to local disk; returns the local directory
  (`layout.Record.of(url)`'s unless `into`).

  Args:
    url: the gs:// workdir.
    into: where to copy it (None: this machine's copy).
    job_id: None for a reader; for a launcher that files its logs in this
      machine's copy, its job's id: the copy becomes that job's (another
      job's set aside, as a process's fetch does) before the launcher
      writes there, so that the job's processes on this machine take what
      it wrote for their own job's.
  """
  mirror = Mirror(url,
                  into or layout.Record.of(url).workdir,
                  owns=lambda _: False,
                  job_id=job_id)
  mirror.fetch()
  return mirror.local_dir
