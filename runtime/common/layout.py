"""The workdir's layout: where each file of a job's record lives, and who
writes it. Every module reads and writes the workdir through here.

  WORKDIR/
    summary.json                the job's results and goodput
    run.json                    process 0's results of the run that ended
    goodput.jsonl               the roll-up, one line an attempt
    metrics.jsonl               process 0's metrics, one line a logged step
    tensorboard/                process 0's event files
    device_batch_limit.json     the largest batch a device was found to fit
    ranks/rank_<i>.json         process i's result, for comparison
    goodput/ATTEMPT/rank_<i>.json, rank_<i>.step
                                process i's ledger and high-water step
    stall/rank_<i>.json         process i's step times, for the next attempt
    logs/rank_<i>.log           process i's output, as the launcher kept it
    logs/attempts.jsonl         the launcher's attempts
    logs/job.json               the launcher's processes
    checkpoints/                orbax's (config.checkpoint_dir elsewhere)
    checkpoints/.podrun_local_tier_id
                                the local tier the local copies belong to
    compilation_cache/          JAX's
    .podrun/join/rank_<i>.json  the roll call of live processes
    .podrun_lease.json          the lease of the job that writes here

Who writes what (`owner`): the launcher `LAUNCHER_FILES` and the rest of
logs/; process i the other files named `rank_<i>.*`; process 0 everything
else. So summary.json, which holds the goodput over every attempt, is the
launcher's, which sees every attempt: it is run.json (process 0's: what the
run that finished ran on and computed) with that goodput added
(records.with_goodput).
Where no launcher reaches the workdir, process 0 writes the launcher's
files too (`writer`, the one exception).

Where the record lives is decided here too (`Record.of`): a local or
shared workdir holds it; a bucket's workdir (gs://) is written on this
machine's copy of it (`local_copy`) and mirrored
(launcher/common/record_mirror.py), while the checkpoints are written to
the bucket itself.

JAX-free: the launcher reads the record too.

Example:
  >>> Record.of('gs://runs/mnist').workdir
  '/home/me/.cache/podrun/record/runs/mnist'
  >>> record = Record('/runs/mnist')
  >>> record.ledger('mnist-a2', 3)
  '/runs/mnist/goodput/mnist-a2/rank_3.json'
  >>> owner('goodput/mnist-a2/rank_3.json'), owner('run.json')
  (3, 0)
"""

import glob
import json
import os
import re
from typing import Optional, Union

from runtime.common import handoff

SUMMARY = 'summary.json'
RUN = 'run.json'
ROLLUP = 'goodput.jsonl'
METRICS = 'metrics.jsonl'
TENSORBOARD = 'tensorboard'
BATCH_LIMIT = 'device_batch_limit.json'
RESULTS = 'ranks'
LEDGERS = 'goodput'
STALL = 'stall'
LOGS = 'logs'
ATTEMPTS = 'attempts.jsonl'
JOB = 'job.json'
CHECKPOINTS = 'checkpoints'
COMPILATION_CACHE = 'compilation_cache'
JOIN = os.path.join('.podrun', 'join')
# In a bucket's local copy: the job whose record the copy holds.
COPY_OF = os.path.join('.podrun', 'copy_of.json')
LEASE = '.podrun_lease.json'
# Every name the job itself writes at the top of a workdir (a workload may
# add its own).
TOP_LEVEL = (SUMMARY, RUN, ROLLUP, METRICS, TENSORBOARD, BATCH_LIMIT, RESULTS,
             LEDGERS, STALL, LOGS, CHECKPOINTS, COMPILATION_CACHE, '.podrun',
             LEASE)

# What the launcher writes (process 0 where no launcher supervises it),
# relative to the workdir, with '/'.
LAUNCHER = 'launcher'
LAUNCHER_FILES = (SUMMARY, ROLLUP, f'{LOGS}/{ATTEMPTS}', f'{LOGS}/{JOB}')
# Never mirrored to a bucket: orbax writes the checkpoints there itself; the
# roll call and the lease coordinate live processes; the cache and the
# launcher's per-process logs belong to the machine that made them.
NEVER_MIRRORED = (f'{CHECKPOINTS}/', '.podrun/', f'{COMPILATION_CACHE}/',
                  f'{LOGS}/')

_RANK = 'rank_'
_RANK_FILE = re.compile(r'(?:^|/)rank_(\d+)\.[^/]*$')


def rank_file(directory: str, process_index: int, suffix: str = '.json') -> str:
  """DIRECTORY/rank_<i>SUFFIX: process i's file of a kind."""
  return os.path.join(directory, f'{_RANK}{process_index}{suffix}')


def rank_of(path: str) -> Union[int, None]:
  """i for a path whose file is rank_<i>.*, else None."""
  match = _RANK_FILE.search(path.replace(os.sep, '/'))
  return int(match.group(1)) if match else None


def ranks(directory: str, suffix: str = '.json') -> dict[int, str]:
  """{i: path} of the rank_<i>SUFFIX files in `directory`, by i."""
  found = {}
  for path in glob.glob(
      os.path.join(glob.escape(directory), f'{_RANK}*{suffix}')):
    index = os.path.basename(path)[len(_RANK):-len(suffix)]
    if index.isdigit():
      found[int(index)] = path
  return dict(sorted(found.items()))


def owner(relative: str) -> Union[int, str]:
  """Who writes the record file `relative` (to the workdir, with '/'):
  a process index, or LAUNCHER (its files, and the processes' output it
  keeps in logs/)."""
  if relative in LAUNCHER_FILES or relative.startswith(f'{LOGS}/'):
    return LAUNCHER
  index = rank_of(relative)
  return 0 if index is None else index


def writer(relative: str, launcher_record: bool) -> Union[int, str]:
  """Who writes the record file `relative` in a job: `owner`'s answer where
  a launcher reaches the workdir and writes its files (`launcher_record`:
  a local pod; a Ray driver; a TPU driver, for a workdir in a bucket; a
  driver writes a bucket's after its last attempt). The one exception:
  where no launcher does (a cluster's job, a job on TPU VMs whose workdir
  is on their disks), process 0 writes them, since only the processes are
  sure to reach the record."""
  who = owner(relative)
  return 0 if who == LAUNCHER and not launcher_record else who


def mirrored(relative: str) -> bool:
  """Whether a bucket's copy of the record holds `relative`."""
  if relative in LAUNCHER_FILES:
    return True
  return not (relative.startswith(NEVER_MIRRORED) or '.tmp' in relative)


def in_bucket(path: Optional[str]) -> bool:
  """True for a gs:// URL."""
  return path is not None and path.startswith('gs://')


def local_copy(url: str) -> str:
  """The local directory that holds this machine's copy of a bucket's
  workdir: $PODRUN_RECORD_CACHE (default ~/.cache/podrun/record) /
  BUCKET/PATH.

  Example:
    >>> local_copy('gs://runs/mnist/')
    '/home/me/.cache/podrun/record/runs/mnist'
  """
  root = handoff.Settings.read().record_cache or os.path.join(
      os.path.expanduser('~'), '.cache', 'podrun', 'record')
  return os.path.join(root, url[len('gs://'):].strip('/'))


def _copy_of(directory: str) -> Optional[str]:
  """The bucket whose copy `directory` is, or None."""
  try:
    with open(os.path.join(directory, COPY_OF)) as f:
      url = json.load(f).get('url')
  except (OSError, ValueError, AttributeError):
    return None
  return url.rstrip('/') if in_bucket(url) else None


class Record:
  """The paths of one workdir, a method each.

  Args:
    workdir: a local directory (a bucket's workdir: its local copy; build
      the record of a --workdir with `Record.of`).
    bucket: the gs:// workdir that `workdir` is a copy of, if any.
  """

  def __init__(self, workdir: str, bucket: Optional[str] = None):
    self.workdir = workdir
    self.bucket = bucket

  @classmethod
  def of(cls, workdir: str) -> 'Record':
    """The record of a job's --workdir: a bucket's is written on this
    machine's copy, `local_copy(workdir)`; and that copy's path (what a
    workload is handed) is the same record again: the `Workdir` the
    launcher hands carries it, and a plain path's bucket is read from the
    copy's COPY_OF."""
    if isinstance(workdir, Workdir):
      return workdir.record
    if in_bucket(workdir):
      return cls(local_copy(workdir), bucket=workdir.rstrip('/'))
    return cls(workdir, bucket=_copy_of(workdir))

  def _path(self, *parts: str) -> str:
    return os.path.join(self.workdir, *parts)

  def summary(self) -> str:
    return self._path(SUMMARY)

  def run(self) -> str:
    return self._path(RUN)

  def rollup(self) -> str:
    return self._path(ROLLUP)

  def metrics(self) -> str:
    return self._path(METRICS)

  def tensorboard(self) -> str:
    return self._path(TENSORBOARD)

  def batch_limit(self) -> str:
    return self._path(BATCH_LIMIT)

  def result(self, process_index: int) -> str:
    return rank_file(self._path(RESULTS), process_index)

  def ledgers(self) -> str:
    """The directory of every attempt's ledgers."""
    return self._path(LEDGERS)

  def ledger(self, attempt: str, process_index: int) -> str:
    return rank_file(self._path(LEDGERS, attempt), process_index)

  def attempts_with_ledgers(self) -> dict[str, dict[int, str]]:
    """{attempt: {process index: its ledger's path}}."""
    out = {}
    for directory in sorted(
        glob.glob(os.path.join(glob.escape(self.ledgers()), '*'))):
      found = ranks(directory)
      if found:
        out[os.path.basename(directory)] = found
    return out

  def stall(self, process_index: int) -> str:
    return rank_file(self._path(STALL), process_index)

  def logs(self) -> str:
    return self._path(LOGS)

  def process_log(self, process_index: int) -> str:
    return rank_file(self.logs(), process_index, '.log')

  def attempts(self) -> str:
    return self._path(LOGS, ATTEMPTS)

  def job(self) -> str:
    return self._path(LOGS, JOB)

  def checkpoints(self) -> str:
    """The persistent checkpoints' directory: a bucket's own, not its
    copy's (orbax writes there itself)."""
    if self.bucket:
      return f'{self.bucket}/{CHECKPOINTS}'
    return self._path(CHECKPOINTS)

  def compilation_cache(self) -> str:
    return self._path(COMPILATION_CACHE)

  def join(self) -> str:
    """The roll call's directory."""
    return self._path(JOIN)


def high_water(ledger_path: str) -> str:
  """The high-water step's file beside a ledger: rank_<i>.step."""
  return ledger_path[:-len('.json')] + '.step'


class Workdir(str):
  """The workdir a workload is handed (`train_and_evaluate(config,
  workdir)`): the path of the record's local directory, as a str, that
  carries its Record, so that `Record.of` need not look for the bucket it
  is a copy of.

  Example:
    >>> workdir = Workdir(Record.of('gs://runs/mnist'))
    >>> workdir, Record.of(workdir).bucket
    ('/home/me/.cache/podrun/record/runs/mnist', 'gs://runs/mnist')
  """
  record: Record

  def __new__(cls, record: Record) -> 'Workdir':
    made = super().__new__(cls, record.workdir)
    made.record = record
    return made
