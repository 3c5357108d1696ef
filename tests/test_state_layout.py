"""state_layout: the (replicas, shards) mesh, the rule that splits each
leaf, and what one device holds (issue 59, first step)."""

import dataclasses

import jax
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np
import optax
import pytest

from runtime.common import exit_codes
from runtime.common import handoff
from runtime.common import layout
from runtime import options as options_lib
from runtime.parallelism import mapping
from runtime import parallelism
from runtime.parallelism import options as parallelism_options
from runtime.parallelism import state_layout

pytestmark = pytest.mark.unit
SHARDS = state_layout.SHARD_AXIS


@pytest.mark.parametrize('shape, shards, dim', [
    ((784, 512), 8, 0),
    ((100, 64), 8, 1),
    ((64, 64), 8, 0),
    ((8,), 8, 0),
    ((4,), 8, None),
    ((), 8, None),
    ((3, 5), 8, None),
    ((784, 512), 1, None),
    ((6, 16, 24), 8, 2),
])
def test_a_leaf_splits_along_its_largest_dimension_that_divides(
    shape, shards, dim):
  assert state_layout.shard_dim(shape, shards) == dim


def _adam_state():
  params = {
      'dense': {
          'kernel': np.zeros((784, 512), np.float32),
          'bias': np.zeros((512,), np.float32)
      },
      'out': {
          'kernel': np.zeros((512, 10), np.float32),
          'bias': np.zeros((10,), np.float32)
      }
  }
  return {'params': params, 'opt_state': optax.adam(1e-3).init(params)}


def test_every_leaf_of_an_adam_state_gets_its_spec():
  layout = state_layout.specs(_adam_state(), 8)
  assert layout['params']['dense']['kernel'] == PartitionSpec(SHARDS)
  assert layout['params']['out']['kernel'] == PartitionSpec(SHARDS)
  assert layout['params']['out']['bias'] == PartitionSpec()
  adam = layout['opt_state'][0]
  assert adam.mu['dense']['bias'] == PartitionSpec(SHARDS)
  assert adam.nu['out']['bias'] == PartitionSpec()
  assert adam.count == PartitionSpec()


def test_an_override_names_a_leaf_by_its_path():
  layout = state_layout.specs(_adam_state(), 8, {
      'params/out/kernel': None,
      '*/dense/kernel': 1
  })
  assert layout['params']['out']['kernel'] == PartitionSpec()
  assert layout['params']['dense']['kernel'] == PartitionSpec(None, SHARDS)
  assert layout['opt_state'][0].mu['dense']['kernel'] == PartitionSpec(
      None, SHARDS)
  with pytest.raises(exit_codes.ConfigError) as error:
    state_layout.specs(_adam_state(), 8, {'params/out/kernel': 1})
  assert "'params/out/kernel'" in str(error.value)
  assert '(512, 10)' in str(error.value) and '(10) 8 shards' in str(error.value)


def test_one_device_holds_an_eighth_and_the_leaves_that_do_not_divide():
  state = _adam_state()
  shards = 8
  used = state_layout.footprint(state, state_layout.specs(state, shards),
                                shards)
  whole_leaves = sum(
      np.asarray(l).nbytes for l in jax.tree_util.tree_leaves(state))
  assert used.replicated_bytes == whole_leaves
  # out/bias (10,) in params, mu and nu, and Adam's count: 3 * 40 + 4 bytes.
  assert used.whole_bytes == 124
  assert used.per_device_bytes <= whole_leaves / shards + used.whole_bytes
  assert {p for p, _ in used.undivided} == {
      'params/out/bias', 'opt_state/0/mu/out/bias', 'opt_state/0/nu/out/bias'
  }
  line = used.describe()
  assert 'split 8 ways' in line and 'params/out/bias (10,)' in line


@dataclasses.dataclass(frozen=True)
class _Device:
  id: int
  process_index: int
  slice_index: object = None


def _devices(processes, per_process, slices=None):
  return [
      _Device(p * per_process + i, p,
              None if slices is None else p * slices // processes)
      for p in reversed(range(processes))
      for i in range(per_process)
  ]


def test_replicas_are_processes_slices_or_everything_in_the_batch_order():
  devices = _devices(4, 2, slices=2)
  by_process = state_layout.replica_groups('process', devices)
  assert [[d.id for d in g] for g in by_process] == [[0, 1], [2, 3], [4, 5],
                                                     [6, 7]]
  by_slice = state_layout.replica_groups('slice', devices)
  assert [[d.id for d in g] for g in by_slice] == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert [
      [d.id for d in g] for g in state_layout.replica_groups('all', devices)
  ] == [list(range(8))]


@pytest.mark.parametrize('replica, devices, words', [
    ('slice', _devices(2, 4), 'no slice_index'),
    ('process', _devices(2, 4)[:-1], 'would hold 3, 4 devices'),
    ('replica', _devices(2, 4), "choose one of 'process', 'slice', 'all'"),
])
def test_a_replica_that_cannot_be_built_is_named(replica, devices, words):
  with pytest.raises(exit_codes.ConfigError, match=words):
    state_layout.replica_groups(replica, devices)


def test_the_mesh_keeps_each_device_on_its_rows_and_holds_an_eighth():
  grid = state_layout.mesh('all')
  assert grid.devices.shape == (1, 8)
  assert list(grid.devices.flat) == list(mapping.global_mesh().devices.flat)
  kernel = np.arange(784 * 512, dtype=np.float32).reshape(784, 512)
  placed = jax.device_put(kernel, NamedSharding(grid, PartitionSpec(SHARDS)))
  pieces = placed.addressable_shards
  assert {s.data.shape for s in pieces} == {(98, 512)}
  assert np.array_equal(np.asarray(placed), kernel)


def _config(**fields):
  from runtime import config_base  # pylint: disable=g-import-not-at-top
  config = config_base.get_config()
  config.update(fields)
  return config


def _placement(**fields):
  return parallelism_options.Placement.of(_config(**fields))


def test_the_layout_is_chosen_by_the_config_and_refused_where_it_cannot_run():
  assert state_layout.replica_of(_placement()) is None
  assert state_layout.replica_of(
      _placement(state_layout='sharded', parallelism='shard_map',
                 replica='all')) == 'all'
  # Left '' (the default), the parallelism is chosen for the layout;
  # pmap named is refused.
  assert state_layout.replica_of(
      _placement(state_layout='sharded')) == 'process'
  assert parallelism.from_config(
      _config(state_layout='sharded')).name == ('shard_map')
  assert parallelism.from_config(_config()).name == 'pmap'
  for fields, words in (({
      'state_layout': 'split'
  }, "choose one of 'replicated', 'sharded'"), ({
      'state_layout': 'sharded',
      'parallelism': 'pmap'
  }, "set config.parallelism='shard_map', or leave it '' to have it "
                                                'chosen'), ({
                                                    'state_layout': 'sharded',
                                                    'parallelism': 'shard_map',
                                                    'replica': 'host'
                                                }, "config.replica='host'")):
    with pytest.raises(exit_codes.ConfigError, match=words):
      state_layout.replica_of(_placement(**fields))
  # Elastic: each process a replica goes on without a lost one; a replica
  # of several processes would lose shards with any of them.
  assert state_layout.replica_of(_placement(state_layout='sharded'),
                                 elastic=(3, 4)) == 'process'
  with pytest.raises(exit_codes.ConfigError,
                     match="replica='all' in an elastic job .processes 3-4"):
    state_layout.replica_of(_placement(state_layout='sharded', replica='all'),
                            elastic=(3, 4))


def test_an_override_by_the_path_s_end_names_the_moments_too():
  layout = state_layout.specs(_adam_state(), 8, {
      'dense/kernel': 1,
      'out/*': None
  })
  adam = layout['opt_state'][0]
  for tree in (layout['params'], adam.mu, adam.nu):
    assert tree['dense']['kernel'] == PartitionSpec(None, SHARDS)
    assert tree['out']['kernel'] == PartitionSpec()
  with pytest.raises(exit_codes.ConfigError) as error:
    state_layout.specs(_adam_state(), 8, {'dense/kernal': 1})
  assert "'dense/kernal' name no leaf" in str(error.value)
  assert 'params/dense/kernel' in str(error.value)


def test_config_shard_dims_parse_to_overrides_or_are_refused():
  assert state_layout.parse_dims('') == {}
  assert state_layout.parse_dims(' embed/embedding=1, out/*=whole ') == {
      'embed/embedding': 1,
      'out/*': None
  }
  for bad in ('embed', 'embed=first', '=1'):
    with pytest.raises(exit_codes.ConfigError) as error:
      state_layout.parse_dims(bad)
    assert f'entry {bad!r}' in str(error.value)


def test_config_shard_dims_win_over_the_task_s(tmp_path):
  """train's choice: config.shard_dims first, then Task.shard_dims, then
  the rule; the console's line counts what stays whole."""
  from runtime import plan  # pylint: disable=g-import-not-at-top
  config = _config(state_layout='sharded',
                   parallelism='shard_map',
                   shard_dims='dense/kernel=whole')
  options = options_lib.TrainOptions.of(config, layout.Record(str(tmp_path)),
                                        handoff.Handoff())
  where = plan._state_layout(  # pylint: disable=protected-access
      options, 1, _adam_state(), {
          'dense/kernel': 1,
          'out/kernel': None
      })
  line = where.where
  params = jax.tree_util.tree_map(lambda s: s.spec, where.shardings['params'])
  assert params['dense']['kernel'] == PartitionSpec()
  assert params['out']['kernel'] == PartitionSpec()
  assert params['dense']['bias'] == PartitionSpec(SHARDS)
  # Both kernels and the (10,) bias, each with its two moments.
  assert '9 leaves kept whole' in line, line
