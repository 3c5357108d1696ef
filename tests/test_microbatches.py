"""Layouts of a global batch on the devices (runtime/parallelism/microbatches.py)."""

import numpy as np
import pytest

from runtime import data
from runtime.parallelism import microbatches

pytestmark = pytest.mark.unit


def test_a_batch_that_divides_is_one_pass_of_its_share():
  layout = microbatches.plan(256, 8)
  assert (layout.microbatch_size, layout.microbatches,
          layout.padded_groups) == (32, 1, 0)
  assert microbatches.process_positions(layout, 1, 4) == (slice(128, 256), 128)


@pytest.mark.parametrize(
    'devices, want',
    [
        (24, (16, 1, 8)),  # 3 processes x 8: 16 busy devices, 8 idle.
        (6, (64, 1, 2)),  # 3 x 2.
        (32, (8, 1, 0)),
        (7, (64, 1, 3))
    ])
def test_a_batch_that_does_not_divide_is_padded_with_whole_groups(
    devices, want):
  layout = microbatches.plan(256, devices)
  assert (layout.microbatch_size, layout.microbatches,
          layout.padded_groups) == want
  assert layout.real_groups * layout.microbatch_size == 256


def test_the_limit_chooses_the_fewest_passes_then_the_least_padding():
  assert microbatches.plan(256, 8, device_batch_limit=16).microbatches == 2
  assert microbatches.plan(256, 8, device_batch_limit=10).microbatch_size == 8
  layout = microbatches.plan(256, 24, device_batch_limit=10)
  assert (layout.microbatch_size, layout.microbatches) == (8, 2)
  assert layout.padding_share == pytest.approx(16 / 48)
  assert microbatches.plan(256, 8, microbatches=4).microbatch_size == 8


def test_a_limit_below_every_group_that_fits_is_named():
  with pytest.raises(microbatches.LayoutError,
                     match=r'global batch size 255 in 1 microbatch\(es\) on 8 '
                     r'devices needs groups of 51 examples .* above '
                     r'config.device_batch_limit=40'):
    microbatches.plan(255, 8, device_batch_limit=40, microbatches=1)


def test_every_example_sits_once_and_padding_comes_last():
  layout = microbatches.plan(256, 6)  # 3 processes x 2 devices.
  held = [microbatches.process_positions(layout, p, 2) for p in range(3)]
  assert [real for _, real in held] == [128, 128, 0]
  assert [rows for rows, _ in held
         ] == [slice(0, 128), slice(128, 256),
               slice(256, 384)]


def test_padding_rows_are_zeros_of_each_leaf():
  source = data.ArraySource(x=np.ones((10, 3), np.float32), label=np.arange(10))
  batch = data.read_padded(source, np.array([4, 5]), 4)
  assert batch['x'].shape == (4, 3) and batch['x'][2:].sum() == 0
  assert batch['label'].tolist() == [4, 5, 0, 0]
  empty = data.read_padded(source, np.array([], np.int64), 3)
  assert empty['x'].shape == (3, 3) and not empty['x'].any()
