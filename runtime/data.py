"""Which examples each step uses, on every process, without talking to others.

The job reads a stream of example ids: epoch e is a permutation of
[0, num_examples) drawn from (seed, e), and the epochs follow one another. Step
s (0-based) takes stream positions [s * G, (s + 1) * G) as its global batch
(G = global batch size); process p then takes its rows of those (see
`parallelism.process_rows`). So:

- every process computes the same global batch for the same step, with no
  communication, whatever the number of processes or devices;
- within each epoch every example is used exactly once: a remainder of fewer
  than G examples at the end of an epoch is not dropped but starts the next
  global batch, which then also holds the first examples of the next epoch
  (chosen so that no example appears twice in that batch);
- the position in the stream is the step number alone, so a job that resumes
  at step s continues with exactly the examples it would have seen.
"""

import functools

import jax
import numpy as np

from runtime import parallelism


def _tail_length(epoch: int, num_examples: int, global_batch_size: int) -> int:
  """How many examples of `epoch` open the batch that ends in epoch + 1."""
  return ((epoch + 1) * num_examples) % global_batch_size


@functools.lru_cache(maxsize=8)
def _permutation(seed: int, epoch: int, num_examples: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(num_examples)


@functools.lru_cache(maxsize=4)
def epoch_order(seed: int,
                epoch: int,
                num_examples: int,
                global_batch_size: int,
                shuffle: bool = True) -> np.ndarray:
  """The order of example ids in one epoch: (num_examples,) int64.

  A shuffled epoch is a permutation drawn from (seed, epoch), adjusted so that
  the global batch it shares with the previous epoch holds no example twice:
  any of the previous epoch's last examples that land in this epoch's first
  positions swap places with examples from the middle of this epoch. The last
  positions of an epoch are never moved, so each epoch depends on the one
  before only through that epoch's unadjusted permutation.
  """
  if not shuffle:
    return np.arange(num_examples, dtype=np.int64)
  order = _permutation(seed, epoch, num_examples).astype(np.int64)
  previous_tail = (_tail_length(epoch - 1, num_examples, global_batch_size)
                   if epoch > 0 else 0)
  if previous_tail:
    head = global_batch_size - previous_tail
    last = _permutation(seed, epoch - 1, num_examples)[-previous_tail:]
    middle_end = num_examples - _tail_length(epoch, num_examples,
                                             global_batch_size)
    clash = np.flatnonzero(np.isin(order[:head], last))
    free = head + np.flatnonzero(~np.isin(order[head:middle_end], last))
    if len(free) < len(clash):
      raise ValueError(
          f'{num_examples} examples are too few for global batches of '
          f'{global_batch_size} without repeating an example within a batch; '
          'use at least two global batches of examples, or config.data.shuffle='
          'False.')
    free = free[:len(clash)]
    order[clash], order[free] = order[free], order[clash].copy()
  order.setflags(write=False)
  return order


def steps_batch_ids(first_step: int,
                    steps: int,
                    global_batch_size: int,
                    num_examples: int,
                    seed: int,
                    shuffle: bool = True) -> np.ndarray:
  """Example ids of the global batches of `steps` consecutive steps, read
  from the stream at once (one call a dispatch, not one a step).

  Args:
    first_step: 0-based step number of the first.
    steps: how many steps, at least 1.
    global_batch_size: G, at most num_examples.
    num_examples: size of the data set.
    seed: the shuffling seed; epoch e uses (seed, e).
    shuffle: False reads the examples in order, epoch after epoch.

  Returns:
    (steps, G) int64 ids; row i is step first_step + i's global batch, all
    distinct; a batch may straddle two epochs.

  Example:
    >>> steps_batch_ids(2, 2, 4, 10, seed=0, shuffle=False)
    array([[8, 9, 0, 1],
           [2, 3, 4, 5]])
  """
  if not 0 < global_batch_size <= num_examples:
    raise ValueError(f'global batch size {global_batch_size} must be between '
                     f'1 and the {num_examples} examples of the data set')
  positions = (first_step * global_batch_size +
               np.arange(steps * global_batch_size))
  epochs = positions // num_examples
  offsets = positions % num_examples
  ids = np.empty(len(positions), np.int64)
  # Positions grow with the index: each epoch is one run of them.
  bounds = np.flatnonzero(np.diff(epochs)) + 1
  for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(positions)]):
    ids[start:stop] = epoch_order(seed, int(epochs[start]), num_examples,
                                  global_batch_size,
                                  shuffle)[offsets[start:stop]]
  return ids.reshape(steps, global_batch_size)


def global_batch_ids(step: int,
                     global_batch_size: int,
                     num_examples: int,
                     seed: int,
                     shuffle: bool = True) -> np.ndarray:
  """Example ids of one step's global batch, all distinct.

  Args:
    step: 0-based step number.
    global_batch_size: G, at most num_examples.
    num_examples: size of the data set.
    seed: the shuffling seed; epoch e uses (seed, e).
    shuffle: False reads the examples in order, epoch after epoch.

  Returns:
    (G,) int64 ids; a batch may straddle two epochs.

  Example:
    >>> global_batch_ids(2, 4, 10, seed=0, shuffle=False)
    array([8, 9, 0, 1])
  """
  return steps_batch_ids(step, 1, global_batch_size, num_examples, seed,
                         shuffle)[0]


def process_batch_ids(step: int,
                      global_batch_size: int,
                      num_examples: int,
                      seed: int,
                      process_index: int,
                      process_count: int,
                      shuffle: bool = True) -> np.ndarray:
  """The ids of one step's global batch that this process loads.

  Returns:
    (G / process_count,) int64 ids, disjoint from every other process's.
  """
  ids = global_batch_ids(step, global_batch_size, num_examples, seed, shuffle)
  return ids[parallelism.process_rows(global_batch_size, process_index,
                                      process_count)]


class ArraySource:
  """A data source over in-memory arrays that share their leading dim.

  `source[i]` is one example, `source.read_batch(ids)` many at once with one
  fancy index per array (what the loop calls).

  Example:
    >>> source = ArraySource(image=images, label=labels)  # (n, ...) each
    >>> source.read_batch(np.array([3, 1]))['label'].shape
    (2,)
  """

  def __init__(self, **arrays: np.ndarray):
    sizes = {name: len(a) for name, a in arrays.items()}
    if len(set(sizes.values())) != 1:
      raise ValueError(f'ArraySource arrays differ in length: {sizes}')
    self.arrays = arrays
    self._size = next(iter(sizes.values()))

  def __len__(self) -> int:
    return self._size

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return {name: a[index] for name, a in self.arrays.items()}

  def read_batch(self, ids: np.ndarray) -> dict[str, np.ndarray]:
    return {name: a[ids] for name, a in self.arrays.items()}


def read_batch(source, ids: np.ndarray):
  """The examples `ids` of a data source, stacked along a new leading dim.

  Args:
    source: anything with `__len__` and `__getitem__(int) -> example` (a
      pytree of arrays), such as a grain `MapDataset`; one with a
      `read_batch(ids)` method of its own is asked for the whole batch.
    ids: (n,) int64 example ids.

  Returns:
    The batch: each leaf (n, ...), in the order of ids.
  """
  reader = getattr(source, 'read_batch', None)
  if reader is not None:
    return reader(ids)
  if not len(ids):  # No example, but every leaf's shape (a process that
    # holds only padding): example 0's, cut to none.
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[None][:0], source[0])
  examples = [source[int(i)] for i in ids]
  return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *examples)


def first_example(source):
  """Example 0 as a batch of one (each leaf (1, ...)), for its shapes and
  dtypes: through `source[0]` where the source has it, so that a source's
  `read_batch` sees only the loop's batches (the ids it reads for steps).
  """
  if hasattr(type(source), '__getitem__'):
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[None], source[0])
  return read_padded(source, np.arange(1), 1)


def read_padded(source, ids: np.ndarray, rows: int):
  """The examples `ids`, then zero rows up to `rows` (a layout's padding,
  which the step never counts; runtime/parallelism/microbatches.py).

  Returns:
    The batch: each leaf (rows, ...).
  """
  return padded(read_batch(source, ids), rows)


def padded(batch, rows: int):
  """`batch` (each leaf (n, ...)) with zero rows after it up to `rows`."""
  if len(jax.tree_util.tree_leaves(batch)[0]) == rows:
    return batch
  return jax.tree_util.tree_map(
      lambda x: np.concatenate(
          [x, np.zeros((rows - len(x),) + x.shape[1:], x.dtype)]), batch)
