import types

import jax
import numpy as np
import optax
import pytest

import runtime
from runtime import data
from runtime import dispatch
from runtime.parallelism import microbatches
from runtime import loader
from runtime import training

pytestmark = pytest.mark.unit


def test_every_process_sees_a_disjoint_part_and_together_the_global_batch():
  for step in range(5):
    global_ids = data.global_batch_ids(step, 48, 1000, seed=3)
    parts = [data.process_batch_ids(step, 48, 1000, 3, p, 4) for p in range(4)]
    np.testing.assert_array_equal(np.concatenate(parts), global_ids)
    assert len(set(np.concatenate(parts).tolist())) == 48


def test_each_epoch_uses_every_example_exactly_once():
  # 10 examples, batches of 4: the remainder of each epoch starts the next
  # batch instead of being dropped.
  stream = np.concatenate(
      [data.global_batch_ids(s, 4, 10, seed=1) for s in range(10)])
  for epoch in range(4):
    assert sorted(stream[epoch * 10:(epoch + 1) * 10].tolist()) == list(
        range(10))
  # Epochs are shuffled differently.
  assert stream[:10].tolist() != stream[10:20].tolist()


def test_no_batch_repeats_an_example_even_across_an_epoch_boundary():
  for num_examples, batch in ((10, 4), (1000, 256), (97, 48), (12, 6)):
    for step in range(60):
      ids = data.global_batch_ids(step, batch, num_examples, seed=5)
      assert len(set(ids.tolist())) == batch, (num_examples, batch, step)


def test_order_depends_on_seed_and_step_only():
  a = data.global_batch_ids(7, 32, 500, seed=0)
  np.testing.assert_array_equal(a, data.global_batch_ids(7, 32, 500, seed=0))
  assert not np.array_equal(a, data.global_batch_ids(7, 32, 500, seed=1))


def test_the_ids_of_several_steps_are_each_steps_ids_across_epochs():
  # 97 examples in batches of 48: calls of 5 steps straddle epochs.
  for first in (0, 1, 7, 30):
    np.testing.assert_array_equal(
        data.steps_batch_ids(first, 5, 48, 97, seed=2),
        [data.global_batch_ids(first + i, 48, 97, seed=2) for i in range(5)])


@pytest.mark.parametrize('devices, processes', [(1, 1), (4, 1), (2, 2), (2, 3)])
def test_a_calls_batch_is_read_at_once_as_stacked_step_by_step(
    devices, processes):
  """The loader's one read of a call's examples gives what stacking each
  step's read gives (3 processes x 2 devices pad 256 rows: the stacked
  path)."""
  rng = np.random.default_rng(0)
  source = runtime.ArraySource(x=rng.random((1000, 3), np.float32),
                               y=np.arange(1000))
  layout = microbatches.plan(256, devices * processes)
  options = types.SimpleNamespace(global_batch_size=256,
                                  seed=4,
                                  shuffle=True,
                                  on_device=False)
  task = types.SimpleNamespace(data=source)
  for p in range(processes):
    topo = types.SimpleNamespace(process_index=p, local_device_count=devices)
    put = types.SimpleNamespace(put_batch=lambda tree: tree)
    load = loader.make(options, task, topo, put, layout)
    rows, real = microbatches.process_positions(layout, p, devices)
    for first, steps in ((0, 1), (3, 4), (5, 3)):
      stacked = dispatch.stack([
          data.read_padded(
              source,
              data.global_batch_ids(s, 256, 1000,
                                    4)[rows.start:rows.start + real],
              rows.stop - rows.start) for s in range(first, first + steps)
      ], devices)
      jax.tree_util.tree_map(np.testing.assert_array_equal, load(first, steps),
                             stacked)


def test_unshuffled_reads_in_order():
  np.testing.assert_array_equal(
      data.global_batch_ids(2, 4, 10, seed=0, shuffle=False), [8, 9, 0, 1])


@pytest.mark.parametrize('data, missing', [
    ((x for x in range(3)), 'len(data) and data[i]'),
    (iter([1, 2]), 'len(data) and data[i]'),
    ({1, 2, 3}, 'data[i]'),
])
def test_a_task_refuses_an_iterator_with_the_fix(data, missing):
  with pytest.raises(training.DataSourceError) as e:
    runtime.Task(params={},
                 loss_fn=lambda p, b: (0.0, {}),
                 optimizer=optax.sgd(0.1),
                 data=data)
  said = str(e.value)
  assert f'has no {missing}' in said
  assert 'runtime.ArraySource(**arrays)' in said and 'grain' in said
  assert e.value.exit_code == 2


def test_a_read_of_no_ids_gives_every_leaf_with_no_row():
  # A process that holds only padding reads no example, from a source with
  # data[i] alone (a grain MapDataset) as from one with read_batch.
  class Indexed:

    def __len__(self):
      return 4

    def __getitem__(self, i):
      return {'x': np.full((2, 3), i, np.float32), 'label': np.int32(i)}

  none = data.read_batch(Indexed(), np.array([], np.int64))
  assert none['x'].shape == (0, 2, 3) and none['label'].shape == (0,)
  padded = data.read_padded(Indexed(), np.array([], np.int64), 3)
  assert padded['x'].shape == (3, 2, 3) and not padded['x'].any()
