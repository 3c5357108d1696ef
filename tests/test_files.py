"""Writing a file whole (runtime/common/files.py)."""

import threading

import pytest

from runtime.common import files

pytestmark = pytest.mark.unit


def test_threads_of_one_process_write_the_same_file_whole(tmp_path):
  """A lease's renewal and its taker write one file from two threads: each
  write lands whole and none fails on the other's temporary file."""
  path = str(tmp_path / 'lease.json')
  texts = ['a' * 1000, 'b' * 2000]
  errors = []

  def write(text):
    try:
      for _ in range(300):
        files.write_atomic(path, text)
    except OSError as e:
      errors.append(e)

  threads = [threading.Thread(target=write, args=(t,)) for t in texts]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, errors[:1]
  assert open(path).read() in texts
  assert [p.name for p in tmp_path.iterdir()] == ['lease.json']
