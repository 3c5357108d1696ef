"""Replica consistency: a flipped bit on one device is named and stops the job."""

import jax
import numpy as np
import pytest

from runtime import integrity
from runtime import parallelism

pytestmark = pytest.mark.devices


def _paths(params):
  return [f'params{path}' for path in integrity.leaf_paths(params)]


def _replicated(par):
  params = {
      'a': np.arange(6, dtype=np.float32).reshape(2, 3),
      'b': {
          'c': np.ones(4, np.float32)
      }
  }
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
  lines = integrity.outliers({
      (0, d): list(r) for d, r in enumerate(rows)
  }, _paths(params))
  assert lines == ["rank 0 device 5: first differs at params['b']['c']"]


def test_outliers_take_the_majority_as_right():
  rows = {(r, d): [1, 2] for r in range(2) for d in range(4)}
  rows[(1, 3)] = [1, 3]
  assert integrity.outliers(rows, ["params['w']", "params['b']"]) == [
      "rank 1 device 3: first differs at params['b']"
  ]
  rows[(1, 3)] = [1, 2]
  assert integrity.outliers(rows, ["params['w']", "params['b']"]) == []


def _sharded_params(replicas):
  """A (16, 8) kernel split 8 / replicas ways, a bias kept whole."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  grid = Mesh(
      np.array(jax.devices()).reshape(replicas, -1), ('replicas', 'shards'))
  shardings = {
      'kernel': NamedSharding(grid, P(None, 'shards')),
      'bias': NamedSharding(grid, P())
  }
  host = {
      'kernel': np.arange(128, dtype=np.float32).reshape(16, 8),
      'bias': np.arange(3, dtype=np.float32)
  }
  return jax.device_put(host, shardings), shardings


def _flip(leaf, device: int):
  """`leaf` with one bit flipped in the part device `device` holds."""
  parts = [s.data for s in leaf.addressable_shards]
  bad = np.array(parts[device]).view(np.uint32)
  bad.flat[0] ^= 1 << 3
  parts[device] = jax.device_put(bad.view(np.float32),
                                 leaf.addressable_shards[device].device)
  return jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding,
                                                  parts)


def test_a_sharded_state_is_checked_shard_by_shard_against_the_other_replicas():
  """2 replicas of 4: device 6 holds shard 2 of the kernel, as device 2
  does; its flipped bit is named, and the parts of a split leaf, which
  differ from shard to shard, are not taken for a divergence."""
  params, shardings = _sharded_params(2)
  rows, positions = integrity.checksums_by_shard(params, shardings)
  assert rows.shape == (8, 2) and positions == [0, 1, 2, 3] * 2
  kernel = _paths(params).index("params['kernel']")
  assert (rows[:4] == rows[4:]).all()
  assert len({r[kernel] for r in rows[:4]}) == 4  # Each its own part.
  keys = lambda values: {(0, d): v for d, v in enumerate(values)}
  paths = _paths(params)
  split = [path == "params['kernel']" for path in paths]
  assert integrity.outliers(keys([list(r) for r in rows]), paths,
                            keys(positions), split) == []
  params['kernel'] = _flip(params['kernel'], 6)
  rows, _ = integrity.checksums_by_shard(params, shardings)
  # Two replicas: device 2 and device 6 split evenly, so both are named.
  assert integrity.outliers(keys([list(r) for r in rows]), paths,
                            keys(positions), split) == [
                                "rank 0 device 2 (shard 2 of 4): first "
                                "differs at params['kernel']",
                                "rank 0 device 6 (shard 2 of 4): first "
                                "differs at params['kernel']"
                            ]
  # Replicated checks would see every device's gathered copy alike.
  gathered = integrity.checksums_by_device(
      {
          k:
              jax.device_put(
                  v,
                  jax.sharding.NamedSharding(parallelism.global_mesh(),
                                             jax.sharding.PartitionSpec()))
          for k, v in params.items()
      }, parallelism.SHARD_MAP)
  assert (gathered == gathered[0]).all()


def test_a_leaf_kept_whole_is_checked_on_every_device_of_one_replica():
  """One replica of 8: a split leaf has no second copy, but the bias kept
  whole is on every device, and device 3's flipped bit in it is named."""
  params, shardings = _sharded_params(1)
  params['bias'] = _flip(params['bias'], 3)
  rows, positions = integrity.checksums_by_shard(params, shardings)
  assert positions == list(range(8))
  keys = lambda values: {(0, d): v for d, v in enumerate(values)}
  paths = _paths(params)
  assert integrity.outliers(keys([list(r) for r in rows]), paths,
                            keys(positions),
                            [path == "params['kernel']" for path in paths]) == [
                                "rank 0 device 3: first differs at "
                                "params['bias']"
                            ]


def test_four_replicas_name_only_the_odd_one():
  params, shardings = _sharded_params(4)
  params['kernel'] = _flip(params['kernel'], 5)
  rows, positions = integrity.checksums_by_shard(params, shardings)
  assert positions == [0, 1] * 4
  paths = _paths(params)
  assert integrity.outliers({
      (0, d): list(r) for d, r in enumerate(rows)
  }, paths, {
      (0, d): p for d, p in enumerate(positions)
  }, [path == "params['kernel']" for path in paths]) == [
      "rank 0 device 5 (shard 1 of 2): first differs at params['kernel']"
  ]


def test_the_model_state_is_checked_with_the_parameters():
  # BatchNorm's statistics are averaged after every step and must agree on
  # every device as the parameters do.
  from runtime import step  # pylint: disable=g-import-not-at-top
  par = parallelism.PMAP
  state = step.TrainState(params=_replicated(par),
                          model_state=par.replicate(
                              {'batch_stats': {
                                  'mean': np.ones(3, np.float32)
                              }}),
                          opt_state=(),
                          rng=None)
  tree, paths = integrity.checked(state)
  assert paths == [
      "model_state['batch_stats']['mean']", "params['a']", "params['b']['c']"
  ]
  mean = tree['model_state']['batch_stats']['mean']
  tree['model_state']['batch_stats']['mean'] = _flip(mean, 4)
  rows = integrity.checksums_by_device(tree, par)
  assert integrity.outliers({
      (0, d): list(r) for d, r in enumerate(rows)
  }, paths) == [
      "rank 0 device 4: first differs at model_state['batch_stats']['mean']"
  ]


def test_a_check_between_saves_is_read_at_the_next_call(tmp_path):
  """The sums of step 30 are compared once step 31's call is out (no save
  at 30 to wait for them): the run stops there, naming step 30."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from configs import linear_regression as linear_regression_config  # pylint: disable=g-import-not-at-top
  from runtime import hooks, training  # pylint: disable=g-import-not-at-top
  from runtime.workloads import linear_regression  # pylint: disable=g-import-not-at-top
  from tests.workloads import probe  # pylint: disable=g-import-not-at-top
  config = linear_regression_config.get_config()
  config.steps, config.integrity_every, config.checkpointing = 60, 10, False
  task, _ = linear_regression.make_task(config)
  seen = []
  flip = hooks.Periodic(25, lambda run: probe.flip_bit(run, 25, 2))
  count = hooks.Periodic(1, lambda run: seen.append(run.step))
  with pytest.raises(integrity.DivergedError,
                     match=r'diverged by step 30 \(they agreed at step 20\); '
                     r'rank 0 device 2: first differs at'):
    training.train(config, str(tmp_path),
                   dataclasses.replace(task, hooks=(flip, count)))
  # The task's hooks run after the check's: they saw step 30 (a check read
  # at once would have stopped before), and not 31, whose hooks it stopped.
  assert seen[-1] == 30
