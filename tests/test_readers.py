"""Worker processes read a batch's records (runtime/readers.py): the same
batch row for row, and a record that raises or a worker that dies ends the
read with what happened, never a hang."""

import re

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


def test_workers_is_a_count_or_auto():
  assert readers.parse(0) == 0 and readers.parse('3') == 3
  assert readers.parse(-1) == readers.parse('auto') == readers.AUTO
  for wrong in (-2, 1.5, True, 'many'):
    with pytest.raises(exit_codes.ConfigError, match='config.data.workers'):
      readers.parse(wrong)


def test_auto_takes_workers_from_a_steps_read_time_and_the_cores():
  # 32 records of 5 ms: 160 ms a step, 8 workers for 20 ms, within the
  # spare cores where the CPU was busy; not bounded by them for waits.
  assert readers.workers_for(0.005, 32, spare_cores=3) == 3
  assert readers.workers_for(0.005, 32, spare_cores=3, cpu_share=0.1) == 8
  assert readers.workers_for(0.005, 32, spare_cores=0) == 0
  assert readers.workers_for(0.1, 64, spare_cores=64) == readers.MOST_WORKERS
  # Under 20 ms a step: none.
  assert readers.workers_for(0.0005, 32, spare_cores=8, cpu_share=0) == 0


def _read_all(reader, source, calls):
  for ids in calls:
    got, want = reader.read(ids), data.read_batch(source, ids)
    for name in want:
      np.testing.assert_array_equal(got[name], want[name])


def test_auto_reads_in_the_process_first_and_then_in_workers():
  calls = [np.arange(i * 16, i * 16 + 16) for i in range(6)]
  fast = records.Records(100)
  with readers.AutoReaders(fast, rows=16, spare_cores=4) as reader:
    _read_all(reader, fast, calls)
    assert reader.workers == 0  # 16 records in well under 20 ms.
  slow = records.Records(100, record_s=0.004)  # 64 ms a step, waiting.
  with readers.AutoReaders(slow, rows=16, spare_cores=1) as reader:
    _read_all(reader, slow, calls[:readers.AUTO_READS])
    assert reader.workers >= 4, reader.workers
    _read_all(reader, slow, calls[readers.AUTO_READS:])


def test_auto_keeps_a_source_that_does_not_pickle_in_the_process():

  class Local(records.Records):  # Defined in a function: it cannot pickle.
    pass

  slow = Local(100, record_s=0.004)
  with readers.AutoReaders(slow, rows=16, spare_cores=4) as reader:
    _read_all(reader, slow, [np.arange(16)] * (readers.AUTO_READS + 1))
    assert reader.workers == 0


def test_auto_in_a_run_trains_as_a_read_in_the_process(tmp_path, caplog):
  """config.data.workers=-1 on heavy records: workers from the fourth read,
  the same parameters as reading in the process."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from configs import linear_regression as config_lib  # pylint: disable=g-import-not-at-top
  from runtime import training  # pylint: disable=g-import-not-at-top
  from runtime.workloads import linear_regression  # pylint: disable=g-import-not-at-top
  config = config_lib.get_config()
  config.steps, config.checkpointing, config.global_batch_size = 8, False, 32
  task, _ = linear_regression.make_task(config)
  task = dataclasses.replace(task,
                             data=records.Arrays(task.data.arrays,
                                                 record_s=0.002))
  config.data.workers = 0
  here = training.train(config, str(tmp_path / 'here'), task)
  config.data.workers = -1
  with caplog.at_level('INFO'):
    auto = training.train(config, str(tmp_path / 'auto'), task)
  assert auto.fingerprint == here.fingerprint
  said = [
      r.getMessage()
      for r in caplog.records
      if 'config.data.workers=auto' in r.getMessage()
  ]
  # 32 records of 2 ms of waiting a step: 4 or more workers for 20 ms.
  assert said and re.match(r'config.data.workers=auto: ([4-9]|1\d) worker',
                           said[0]), said
