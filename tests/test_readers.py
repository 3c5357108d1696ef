"""Worker processes read a batch's records (runtime/readers.py): the same
batch row for row, and a record that raises or a worker that dies ends the
read with what happened, never a hang."""

import numpy as np
import pytest

from runtime import data
from runtime import readers
from runtime.common import exit_codes
from tests.workloads import records

pytestmark = pytest.mark.devices


def test_workers_read_the_batch_a_process_reads():
  source = records.Records(100)
  with readers.Readers(source, workers=3) as pool:
    for ids in (np.arange(64), np.random.default_rng(0).permutation(100)[:37],
                np.array([5]), np.array([], np.int64)):
      got, want = pool.read(ids), data.read_batch(source, ids)
      assert set(got) == set(want)
      for name in want:
        np.testing.assert_array_equal(got[name], want[name])
        assert got[name].dtype == want[name].dtype


def test_a_record_that_raises_is_named_with_the_workers_traceback():
  with readers.Readers(records.Records(100, raises=42), workers=2) as pool:
    with pytest.raises(readers.WorkerError) as e:
      pool.read(np.arange(30, 60))
  said = str(e.value)
  assert said.startswith('record 42 of the data source raised in a data '
                         'worker (config.data.workers=2)')
  assert 'ValueError: record 42 is corrupt' in said and 'Traceback' in said
  assert e.value.exit_code == exit_codes.FAILED


def test_a_worker_that_dies_ends_the_read_naming_its_records():
  with readers.Readers(records.Records(100, dies=7), workers=2) as pool:
    with pytest.raises(readers.WorkerError,
                       match=r'a data worker died while reading records 0 to '
                             r'9 \(config.data.workers=2\)'):
      pool.read(np.arange(20))


def test_a_source_that_does_not_pickle_is_refused_with_the_fix():
  class Local:  # Defined in a function: pickle cannot find it.
    def __len__(self):
      return 1

    def __getitem__(self, i):
      return {'x': np.zeros(1)}
  with pytest.raises(exit_codes.ConfigError,
                     match='must pickle to reach the worker processes'):
    readers.Readers(Local(), workers=2)
