"""Each process's part of a sharded state, in one process of 8 devices:
its blocks, put back, and selected from other replicas bit for bit."""

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from runtime.checkpoints import recovery
from runtime.checkpoints import shard_parts
from runtime import step as step_lib

pytestmark = pytest.mark.devices


def _grid(replicas):
  return Mesh(
      np.array(jax.devices()).reshape(replicas, -1), ('replicas', 'shards'))


def _state():
  kernel = np.arange(32, dtype=np.float32).reshape(4, 8) - 16
  kernel[0, 0] = -0.0  # A sign a sum would lose.
  return step_lib.TrainState(params={
      'kernel': kernel,
      'bias': np.arange(3, dtype=np.float32)
  },
                             model_state={},
                             opt_state={'count': np.array(3, np.int32)},
                             rng=np.array([5, 6], np.uint32))


def _shardings(grid):
  return step_lib.state_shardings(
      grid,
      step_lib.TrainState({
          'kernel': P(None, 'shards'),
          'bias': P()
      }, {}, {'count': P()}, P()))


def _same_bits(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a),
                  jax.tree_util.tree_leaves(b),
                  strict=True):
    x = np.asarray(x)
    assert x.dtype == y.dtype and x.shape == y.shape and (x.tobytes()
                                                          == y.tobytes())


def test_positions_name_each_process_s_place_in_its_replica():
  where = shard_parts.positions(_grid(1))
  assert where == {0: shard_parts.Position(0, 0, 1, 1)}
  assert where[0].describe() == {
      'position': 0,
      'processes_per_replica': 1,
      'replicas': 1
  }


@pytest.mark.parametrize('replicas', [1, 2, 4])
def test_one_process_s_part_is_the_whole_state_and_goes_back_in_place(replicas):
  state, shardings = _state(), _shardings(_grid(replicas))
  placed = jax.device_put(state, shardings)
  part = shard_parts.own(placed)
  _same_bits(part, state)  # One process holds every block.
  assert jax.tree_util.tree_map(np.shape, shard_parts.like_own(
      state, shardings)) == jax.tree_util.tree_map(np.shape, state)
  back = shard_parts.place(part, shardings, state)
  _same_bits(back, state)
  for x, sharding in zip(jax.tree_util.tree_leaves(back),
                         jax.tree_util.tree_leaves(shardings)):
    assert x.sharding == sharding


def test_assemble_selects_each_shard_from_its_source_s_replica():
  """Pools whose replica rows differ: each shard of the result comes from
  the row `take` names for it, every bit, -0.0 included."""
  grid = _grid(2)
  state, shardings = _state(), _shardings(grid)
  state.params['flag'] = np.array(
      [True, False, True, True, False, False, True, False])
  shardings.params['flag'] = NamedSharding(grid, P('shards'))
  placements, treedef = jax.tree_util.tree_flatten(shardings)
  rows = [
      jax.tree_util.tree_leaves(state),
      [
          ~x if x.dtype == bool else x + 100
          for x in jax.tree_util.tree_leaves(state)
      ]
  ]
  pools = [
      jax.device_put(np.stack([a, b]),
                     NamedSharding(grid, P('replicas', *s.spec)))
      for a, b, s in zip(*rows, placements)
  ]
  take = (0, 1, 1, 0)
  chosen = shard_parts._select(  # pylint: disable=protected-access
      grid, treedef, tuple(s.spec for s in placements), take)(pools)
  kernel = np.asarray(chosen.params['kernel'])
  for shard, row in enumerate(take):
    want = state.params['kernel'] + 100 * row
    np.testing.assert_array_equal(kernel[:, 2 * shard:2 * shard + 2],
                                  want[:, 2 * shard:2 * shard + 2])
  assert np.signbit(kernel[0, 0])
  # A split bool leaf from its rows too (row 1 holds its negation).
  np.testing.assert_array_equal(
      np.asarray(chosen.params['flag']),
      [True, False, False, False, True, True, True, False])
  # A whole leaf comes from the first shard's replica.
  np.testing.assert_array_equal(np.asarray(chosen.params['bias']),
                                state.params['bias'])
  assert chosen.params['kernel'].sharding == shardings.params['kernel']


@pytest.mark.parametrize(
    'local_steps, positions, expected',
    [
        # Position 1 lost its copy of 40: both go back to 30, each its own.
        ({
            0: [30, 40],
            1: [30]
        }, {
            0: 0,
            1: 1
        }, recovery.Plan(30, 'local', holders=(0, 1))),
        # Two replicas of two processes: position 1 of replica 0 (process 1)
        # lost 40; process 3 holds position 1 in replica 1.
        ({
            0: [40],
            1: [],
            2: [40],
            3: [40]
        }, {
            0: 0,
            1: 1,
            2: 0,
            3: 1
        }, recovery.Plan(40, 'peer', 0, (0, 2, 3), sources={
            0: 0,
            1: 3
        })),
        # No position 1 anywhere: the persistent tier.
        ({
            0: [40],
            1: [],
            2: [40],
            3: []
        }, {
            0: 0,
            1: 1,
            2: 0,
            3: 1
        }, recovery.Plan(20, 'persistent')),
    ])
def test_a_sharded_plan_needs_every_position(local_steps, positions, expected):
  assert recovery.plan(local_steps, 20 if expected.step == 20 else None,
                       positions) == expected


def test_a_part_fits_another_count_of_replicas_but_no_other_position():
  """A local copy's part is offered where this process would hold the same
  blocks: a replica lost or back changes the replicas, nothing else."""
  mine = {
      'position': 0,
      'processes_per_replica': 1,
      'replicas': 3,
      'split': 'abc'
  }
  assert shard_parts.fits({**mine, 'replicas': 4}, mine)
  assert not shard_parts.fits({**mine, 'position': 1}, mine)
  assert not shard_parts.fits({**mine, 'processes_per_replica': 2}, mine)
  assert not shard_parts.fits({**mine, 'split': 'abd'}, mine)
  assert not shard_parts.fits(None, mine)
