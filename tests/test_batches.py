import numpy as np
import pytest

from runtime import parallelism

pytestmark = pytest.mark.unit


def test_per_device_batch_size():
  assert parallelism.per_device_batch_size(256, 2, 4) == 32
  assert parallelism.per_device_batch_size(8, 1, 8) == 1


def test_indivisible_global_batch_names_every_number():
  with pytest.raises(parallelism.BatchSizeError) as e:
    parallelism.per_device_batch_size(100, 2, 4)
  message = str(e.value)
  for text in ('100', '2 processes', '4 local devices', '8 devices', '96',
               '104'):
    assert text in message


def test_process_slices_partition_the_global_batch():
  covered = np.concatenate(
      [np.arange(96)[parallelism.process_rows(96, p, 4)] for p in range(4)])
  np.testing.assert_array_equal(covered, np.arange(96))


def test_split_and_merge_round_trip():
  batch = {'x': np.arange(64 * 3).reshape(64, 3), 'y': np.arange(64)}
  split = parallelism.split_for_devices(batch, 8)
  assert split['x'].shape == (8, 8, 3) and split['y'].shape == (8, 8)
  # Device d holds rows [8d, 8d + 8): contiguous, in order.
  np.testing.assert_array_equal(split['y'][3], np.arange(24, 32))
  merged = parallelism.merge_devices(split)
  np.testing.assert_array_equal(merged['x'], batch['x'])
  np.testing.assert_array_equal(merged['y'], batch['y'])


def test_split_explains_the_device_axis():
  with pytest.raises(parallelism.BatchSizeError) as e:
    parallelism.split_for_devices({'x': np.zeros((10, 3))}, 8)
  message = str(e.value)
  assert "batch['x']" in message and '(10, 3)' in message
  assert '8 local devices' in message and '(8, n // 8, ...)' in message
  assert '8 or 16' in message
