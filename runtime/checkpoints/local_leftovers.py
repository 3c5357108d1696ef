"""Other jobs' local copies on this host: removed when no run can use them.

The local tier (runtime/checkpoints/local_checkpoint.py) keeps its copies in
memory (/dev/shm) by default, and on a TPU VM that is the host's RAM. A job
that ends well removes its own. What a failed or stopped job leaves is decided
here, by every process at its job's start, for the copies beside its own
(LOCAL_DIR/JOB for every other JOB):

- removed when the job's checkpoint directory (recorded in JOB/owner.json)
  is gone: the workdir was deleted, so nothing resumes them;
- removed when nothing was written to them for
  config.local_checkpoint_leftover_hours (default 24): a job not resumed
  within that time resumes from its persistent checkpoints instead;
- named, with their size, otherwise: a job that may still resume (one
  stopped with Ctrl-C or the TPU driver's --stop) keeps them.

A job's directory that holds no copy is never named: nothing resumes from
it. It is removed once it is an hour old (before that it may be a job
that is starting: the local tier makes its directories at its first save,
so a refused run leaves none).

Only directories named as the local tier names its jobs are touched, so a
local_checkpoint_dir shared with other files is safe.

Example:
  >>> write_owner('/dev/shm/podrun-0/3f2a9c0d11e24b5a', '/runs/a/checkpoints')
  >>> sweep('/dev/shm/podrun-0', own_job='3f2a9c0d11e24b5a', max_age_s=86400)
  ['kept local copies of another job: /dev/shm/podrun-0/77b1... (11.0 MB, ...']
"""

import json
import os
import re
import shutil
import time
from typing import Optional

OWNER_FILE = 'owner.json'
# A job's directory with no copy in it, unwritten this long, is not a job
# that is starting (its first save comes later).
_EMPTY_AGE_S = 3600.0
_JOB_DIR = re.compile(r'^[0-9a-f]{16}$')


def write_owner(job_dir: str, checkpoint_dir: str) -> None:
  """Records which checkpoint directory the copies in `job_dir` belong to."""
  os.makedirs(job_dir, exist_ok=True)
  path = os.path.join(job_dir, OWNER_FILE)
  tmp = f'{path}.{os.getpid()}'
  with open(tmp, 'w') as f:
    json.dump({'checkpoint_dir': checkpoint_dir}, f)
  os.replace(tmp, path)


def _owner(job_dir: str) -> Optional[str]:
  try:
    with open(os.path.join(job_dir, OWNER_FILE)) as f:
      return json.load(f).get('checkpoint_dir')
  except (OSError, ValueError, AttributeError):
    return None


def _size_and_newest(job_dir: str) -> tuple[int, float]:
  """Bytes under `job_dir`, and the newest modification time there."""
  size, newest = 0, os.path.getmtime(job_dir)
  for top, _, names in os.walk(job_dir):
    for name in names:
      try:
        stat = os.stat(os.path.join(top, name))
      except OSError:
        continue
      size += stat.st_size
      newest = max(newest, stat.st_mtime)
  return size, newest


def _holds_copies(job_dir: str) -> bool:
  """Whether any process's directory under `job_dir` holds a copy (a
  `step_N` directory, complete or being written)."""
  for top, subdirs, _ in os.walk(job_dir):
    if any(d.startswith(('step_', '.tmp_step_')) for d in subdirs):
      return True
    if top != job_dir:
      subdirs[:] = []  # Copies sit one level down: JOB/rank_i/step_N.
  return False


def _gone(checkpoint_dir: Optional[str]) -> bool:
  """Whether a local checkpoint directory no longer exists (a bucket's is
  not looked up: that costs a request from every host)."""
  return (checkpoint_dir is not None and '://' not in checkpoint_dir and
          not os.path.isdir(checkpoint_dir))


def sweep(root: str,
          own_job: str,
          max_age_s: float,
          now: Optional[float] = None) -> list[str]:
  """Removes the other jobs' copies under `root` that no run can use.

  Args:
    root: the local tier's directory (LOCAL_DIR).
    own_job: this job's id, whose copies are never touched.
    max_age_s: copies unwritten for longer are removed.
    now: the wall time (tests).

  Returns:
    One line per job directory removed or kept, for the log.
  """
  now = time.time() if now is None else now
  lines: list[str] = []
  try:
    names = sorted(os.listdir(root))
  except OSError:
    return lines
  for name in names:
    job_dir = os.path.join(root, name)
    if name == own_job or not _JOB_DIR.match(name) or not os.path.isdir(
        job_dir):
      continue
    size, newest = _size_and_newest(job_dir)
    owner = _owner(job_dir)
    age_h = (now - newest) / 3600
    what = (f'{job_dir} ({size / 1e6:.1f} MB, last written {age_h:.1f} h '
            f'ago, checkpoints in {owner or "an unrecorded directory"})')
    if not _holds_copies(job_dir):
      # Nothing to resume from (a job that was refused or never saved):
      # not worth a line, and removed once it cannot be a job starting.
      if _gone(owner) or now - newest > _EMPTY_AGE_S:
        shutil.rmtree(job_dir, ignore_errors=True)
      continue
    if _gone(owner) or now - newest > max_age_s:
      why = ('its checkpoint directory is gone'
             if _gone(owner) else f'not resumed within {max_age_s / 3600:g} h')
      shutil.rmtree(job_dir, ignore_errors=True)
      lines.append(f'removed local copies of another job, {why}: {what}')
    else:
      lines.append(f'kept local copies of another job, which may resume: '
                   f'{what}; removed when that job ends well, when its '
                   f'checkpoint directory is gone or after '
                   f'{max_age_s / 3600:g} h unwritten')
  return lines
