"""Other jobs' local copies: removed when no run can use them, named otherwise."""

import os

import pytest

from runtime.checkpoints import local_leftovers

pytestmark = pytest.mark.unit

DAY = 24 * 3600.0


def _job(root, name, checkpoint_dir, mb=1, age_s=0.0):
  job_dir = root / name
  local_leftovers.write_owner(str(job_dir), str(checkpoint_dir))
  step = job_dir / 'rank_0' / 'step_25'
  step.mkdir(parents=True)
  (step / 'state.npz').write_bytes(bytes(mb * 1_000_000))
  then = os.path.getmtime(step / 'state.npz') - age_s
  for path in (step / 'state.npz', step, job_dir / 'rank_0', job_dir,
               job_dir / local_leftovers.OWNER_FILE):
    os.utime(path, (then, then))
  return job_dir


def test_copies_whose_checkpoints_are_gone_or_stale_are_removed(tmp_path):
  root = tmp_path / 'shm'
  alive = tmp_path / 'run_a' / 'checkpoints'
  alive.mkdir(parents=True)
  own = _job(root, 'a' * 16, alive)
  resumable = _job(root, 'b' * 16, alive, mb=11)
  deleted_workdir = _job(root, 'c' * 16, tmp_path / 'gone' / 'checkpoints')
  stale = _job(root, 'd' * 16, alive, age_s=2 * DAY)
  in_a_bucket = _job(root, 'e' * 16, 'gs://bucket/run/checkpoints')
  not_ours = root / 'notes'
  not_ours.mkdir()
  lines = local_leftovers.sweep(str(root), 'a' * 16, DAY)
  assert own.exists() and resumable.exists() and in_a_bucket.exists()
  assert not deleted_workdir.exists() and not stale.exists()
  assert not_ours.exists()  # Not named as the local tier names jobs.
  said = '\n'.join(lines)
  assert (f'removed local copies of another job, its checkpoint directory '
          f'is gone: {deleted_workdir}') in said
  assert f'not resumed within 24 h: {stale}' in said
  assert (f'kept local copies of another job, which may resume: '
          f'{resumable} (11.0 MB') in said
  assert len(lines) == 4


def test_a_missing_root_is_nothing_to_sweep(tmp_path):
  assert local_leftovers.sweep(str(tmp_path / 'none'), 'a' * 16, DAY) == []


def test_a_job_directory_without_copies_is_never_reported(tmp_path):
  # What a refused run of an older podrun left: owner.json and an empty
  # rank directory. Nothing in it resumes anything, so no line names it;
  # a recent one may be a job that is starting, and stays.
  root = tmp_path / 'shm'
  alive = tmp_path / 'run' / 'checkpoints'
  alive.mkdir(parents=True)
  empty_old = root / ('f' * 16)
  empty_new = root / ('1' * 16)
  for job_dir in (empty_old, empty_new):
    local_leftovers.write_owner(str(job_dir), str(alive))
    (job_dir / 'rank_0').mkdir()
  then = os.path.getmtime(empty_old) - 2 * 3600
  for path in (empty_old, empty_old / 'rank_0',
               empty_old / local_leftovers.OWNER_FILE):
    os.utime(path, (then, then))
  with_copies = _job(root, 'b' * 16, alive)
  lines = local_leftovers.sweep(str(root), 'a' * 16, DAY)
  assert not empty_old.exists() and empty_new.exists()
  assert with_copies.exists()
  assert len(lines) == 1 and str(with_copies) in lines[0], lines
