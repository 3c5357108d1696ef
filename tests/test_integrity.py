"""Replica consistency: a flipped bit on one device is named and stops the job."""

import jax
import numpy as np
import pytest

from runtime import integrity
from runtime import parallelism

pytestmark = pytest.mark.devices


def _replicated(par):
  params = {'a': np.arange(6, dtype=np.float32).reshape(2, 3),
            'b': {'c': np.ones(4, np.float32)}}
  return par.replicate(params)


@pytest.mark.parametrize('par', [parallelism.PMAP, parallelism.SHARD_MAP],
                         ids=lambda p: p.name)
def test_every_device_sums_its_own_copy(par):
  assert jax.local_device_count() == 8, jax.devices()
  rows = integrity.checksums_by_device(_replicated(par), par)
  assert rows.shape == (8, 2) and rows.dtype == np.uint32
  assert (rows == rows[0]).all()


def test_a_flipped_bit_on_one_device_is_named_with_its_path():
  params = _replicated(parallelism.PMAP)
  leaf = params['b']['c']
  shards = [s.data for s in leaf.addressable_shards]
  bad = np.array(shards[5]).view(np.uint32)
  bad[2] ^= 1 << 7
  shards[5] = jax.device_put(bad.view(np.float32),
                             leaf.addressable_shards[5].device)
  params['b']['c'] = jax.make_array_from_single_device_arrays(
      leaf.shape, leaf.sharding, shards)
  rows = integrity.checksums_by_device(params, parallelism.PMAP)
  assert [d for d in range(8) if (rows[d] != rows[0]).any()] == [5]
  lines = integrity.outliers({(0, d): list(r) for d, r in enumerate(rows)},
                             integrity.leaf_paths(params))
  assert lines == ["rank 0 device 5: first differs at params['b']['c']"]


def test_outliers_take_the_majority_as_right():
  rows = {(r, d): [1, 2] for r in range(2) for d in range(4)}
  rows[(1, 3)] = [1, 3]
  assert integrity.outliers(rows, ["['w']", "['b']"]) == [
      "rank 1 device 3: first differs at params['b']"]
  rows[(1, 3)] = [1, 2]
  assert integrity.outliers(rows, ["['w']", "['b']"]) == []
