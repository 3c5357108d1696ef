"""Exact evaluation over every device of every process.

Every example of the evaluation set is scored exactly once: the set is cut
into global batches of `global_batch_size` ids; the last batch is padded with
copies of example 0 whose mask is 0; each process takes its slice of every
global batch (so every process runs the same number of eval steps, which the
collectives need) and splits it over its devices. Each step psums, over all
devices, the masked sums of the per-example metrics and the number of real
examples, so the result is weighted by examples, not by batches or devices.
"""

import functools
import math
from typing import Any, Callable, Iterator

import jax
from jax import lax
import numpy as np

from runtime.common import exit_codes
from runtime import data as data_lib
from runtime import parallelism as parallelism_lib

# metric_fn(params, batch) -> {name: (n,) per-example values}, on one device.
MetricFn = Callable[[Any, Any], dict[str, jax.Array]]


def eval_batches(num_examples: int, global_batch_size: int,
                 process_index: int, process_count: int
                 ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Yields this process's (ids, mask) for each global eval batch.

  Args:
    num_examples: size of the evaluation set.
    global_batch_size: examples per eval step over all devices.
    process_index, process_count: this process and how many there are.

  Yields:
    ids: (global_batch_size // process_count,) int64, padding ids are 0.
    mask: same shape, float32, 1 for a real example and 0 for padding.

  Example:
    >>> [m.sum() for _, m in eval_batches(10, 4, 0, 1)]
    [4.0, 4.0, 2.0]
  """
  for start in range(0, num_examples, global_batch_size):
    ids = np.arange(start, start + global_batch_size, dtype=np.int64)
    mask = (ids < num_examples).astype(np.float32)
    ids = np.where(mask > 0, ids, 0)
    part = parallelism_lib.process_rows(global_batch_size, process_index,
                                        process_count)
    yield ids[part], mask[part]


def num_eval_steps(num_examples: int, global_batch_size: int) -> int:
  return math.ceil(num_examples / global_batch_size)


@functools.lru_cache(maxsize=8)
def make_eval_step(metric_fn: MetricFn,
                   parallelism: parallelism_lib.Parallelism) -> Callable:
  """The data-parallel `(params, batch, mask) -> sums` over every device.

  params are replicated; batch and mask are placed with
  `parallelism.put_batch`. Returns {name: masked sum} plus
  {'num_examples': count}, psummed over every device and so the same
  everywhere.
  """
  def step(params, batch, mask):
    values = metric_fn(params, batch)
    _check_per_example(values, mask.shape[0])
    sums = {k: _sum(v * mask) for k, v in values.items()}
    sums['num_examples'] = _sum(mask)
    return lax.psum(sums, parallelism_lib.DATA_AXIS)

  return parallelism.map(step, in_axes=(None, 0, 0), out_axes=None)


class MetricShapeError(exit_codes.ConfigError):
  """A metric_fn returned something other than one value per example."""


def _check_per_example(values: Any, n: int) -> None:
  """Refuses, at trace time, any metric that is not of shape (n,): a mean
  would be weighted by batches, not examples, and counted with the padding."""
  if not isinstance(values, dict):
    raise MetricShapeError(
        f'metric_fn returned a {type(values).__name__}; it must return '
        f'{{name: per-example values of shape ({n},)}}')
  for name, value in sorted(values.items()):
    shape = tuple(getattr(value, 'shape', ()))
    if shape != (n,):
      raise MetricShapeError(
          f'metric_fn\'s {name!r} has shape {shape}; it must hold one value '
          f'per example of the device\'s batch, shape ({n},), not a mean: '
          'the last batch is padded, and only per-example values can leave '
          'the padding out.')


def _sum(x):
  return x.astype(np.float32).sum()


def evaluate(params: Any, metric_fn: MetricFn, source: Any,
             global_batch_size: int,
             parallelism: parallelism_lib.Parallelism) -> dict[str, float]:
  """Scores every example once; returns example-weighted means.

  Args:
    params: replicated parameters, or any replicated pytree that metric_fn
      takes first (as the training step keeps them).
    metric_fn: per-example metrics of one device's batch.
    source: the evaluation set, a data source as `runtime.data.read_batch`
      reads one.
    global_batch_size: examples per eval step; must divide over the devices.
    parallelism: as the parameters were placed.

  Returns:
    {name: sum over examples / num_examples, ..., 'num_examples': int}.

  Example:
    >>> evaluate(state.params, metric_fn, test_source, 512, parallelism.PMAP)
    {'accuracy': 0.97..., 'loss': 0.09..., 'num_examples': 10001}
  """
  process_index, process_count = jax.process_index(), jax.process_count()
  local_devices = jax.local_device_count()
  parallelism_lib.per_device_batch_size(global_batch_size, process_count,
                                 local_devices)
  step = make_eval_step(metric_fn, parallelism)
  num_examples = len(source)
  totals = None
  for ids, mask in eval_batches(num_examples, global_batch_size,
                                process_index, process_count):
    batch = data_lib.read_batch(source, ids)
    sums = step(params, *parallelism.put_batch((batch, mask)))
    # float64 on host: float32 would lose counts beyond 2**24 examples.
    sums = {k: np.float64(v) for k, v in parallelism.to_host(sums).items()}
    totals = sums if totals is None else {k: totals[k] + sums[k]
                                          for k in totals}
  count = int(round(totals.pop('num_examples')))
  if count != num_examples:
    raise AssertionError(f'evaluated {count} examples, expected '
                         f'{num_examples}')
  return {**{k: v / count for k, v in totals.items()}, 'num_examples': count}
