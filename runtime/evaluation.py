"""Exact evaluation over every device of every process.

Every example of the evaluation set is scored exactly once: the set is cut
into eval steps of `global_batch_size` ids (fewer where a device batch limit
asks), and each step's rows are padded up to a multiple of the device count
with copies of example 0 whose mask is 0, as training pads its global batch
with groups that never count. So `eval_batch_size` need not divide the
devices of any topology an elastic job runs on. Each process takes its share
of every step's rows (so every process runs the same number of eval steps,
which the collectives need) and splits it over its devices. Each step psums,
over all devices, the masked sums of the per-example metrics and the number
of real examples, so the result is weighted by examples, not by batches,
devices or padding. A metric given as `runtime.Weighted(totals, weights)`,
each (n,) (an LM's summed token loss of each row and its count of real
tokens), is the sum of its totals over the sum of its weights instead: the
token-weighted figure.

Before step 1, `runtime.train` calls the task's eval_fn once inside
`check_eval_fn`: there `evaluate` traces metric_fn on its first batch and
runs nothing, so that a metric_fn returning a mean is refused before the
run rather than after it.
"""

import dataclasses
import functools
import math
import threading
from typing import Any, Callable, Iterator, Optional

from absl import logging
import jax
from jax import lax
import numpy as np

from runtime.common import exit_codes
from runtime import data as data_lib
from runtime import parallelism as parallelism_lib
from runtime import weighted as weighted_lib

# The key of a Weighted metric's summed weights among an eval step's sums.
_WEIGHT = '{}/weight'

# metric_fn(params, batch) -> {name: (n,) per-example values, or
# Weighted((n,) totals, (n,) weights)}, on one device.
MetricFn = Callable[[Any, Any], dict[str, jax.Array]]


@dataclasses.dataclass(frozen=True)
class EvalLayout:
  """How one eval step's examples sit on the devices.

  Attributes:
    examples: real examples per eval step (the last step may have fewer).
    rows: examples plus padding, a multiple of the device count.
  """
  examples: int
  rows: int


def plan(global_batch_size: int,
         num_devices: int,
         device_batch_limit: Optional[int] = None) -> EvalLayout:
  """The eval step's layout on `num_devices` devices.

  Args:
    global_batch_size: config.eval_batch_size, examples per eval step.
    num_devices: every device of every process.
    device_batch_limit: the most rows a device takes in one pass
      (config.device_batch_limit; None or 0: no limit); an eval step then
      takes at most num_devices x the limit examples.

  Example:
    >>> plan(1024, 48)     # 1024 do not divide over 48 devices
    EvalLayout(examples=1024, rows=1056)
    >>> plan(1024, 8, device_batch_limit=64)
    EvalLayout(examples=512, rows=512)
  """
  if global_batch_size <= 0 or num_devices <= 0:
    raise parallelism_lib.BatchSizeError(
        f'eval batch size {global_batch_size} over {num_devices} devices: '
        'both must be positive (config.eval_batch_size)')
  examples = global_batch_size
  if device_batch_limit:
    examples = min(examples, num_devices * device_batch_limit)
  return EvalLayout(examples, num_devices * math.ceil(examples / num_devices))


def eval_batches(num_examples: int, layout: EvalLayout, process_index: int,
                 process_count: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Yields this process's (ids, mask) for each eval step.

  Args:
    num_examples: size of the evaluation set.
    layout: the eval step's examples and rows (`plan`).
    process_index, process_count: this process and how many there are.

  Yields:
    ids: (layout.rows // process_count,) int64, padding ids are 0.
    mask: same shape, float32, 1 for a real example and 0 for padding.

  Example:
    >>> [m.sum() for _, m in eval_batches(10, plan(4, 3), 0, 1)]
    [4.0, 4.0, 2.0]
  """
  part = parallelism_lib.process_rows(layout.rows, process_index, process_count)
  for start in range(0, num_examples, layout.examples):
    ids = np.arange(start, start + layout.rows, dtype=np.int64)
    real = min(start + layout.examples, num_examples)
    mask = (ids < real).astype(np.float32)
    ids = np.where(mask > 0, ids, 0)
    yield ids[part], mask[part]


def num_eval_steps(num_examples: int, layout: EvalLayout) -> int:
  return math.ceil(num_examples / layout.examples)


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
    sums = {}
    for name, value in values.items():
      if isinstance(value, weighted_lib.Weighted):
        sums[name] = _sum(value.total * mask)
        sums[_WEIGHT.format(name)] = _sum(value.weight * mask)
      else:
        sums[name] = _sum(value * mask)
    sums['num_examples'] = _sum(mask)
    return lax.psum(sums, parallelism.axis)

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
    parts = ((' (its Weighted total)', value.total),
             (' (its Weighted weight)', value.weight)) if isinstance(
                 value, weighted_lib.Weighted) else (('', value),)
    for part, x in parts:
      shape = tuple(getattr(x, 'shape', ()))
      if shape != (n,):
        raise MetricShapeError(
            f'metric_fn\'s {name!r}{part} has shape {shape}; it must hold '
            f'one value per example of the device\'s batch, shape ({n},), '
            'not a mean: the last batch is padded, and only per-example '
            'values can leave the padding out. For a figure weighted by '
            'tokens, return runtime.Weighted(each row\'s summed loss, each '
            'row\'s count of real tokens).')


def _sum(x):
  return x.astype(np.float32).sum()


class _Checking(threading.local):
  """Whether `evaluate` only traces (inside `check_eval_fn`), and the error
  its trace raised, if any."""
  active = False
  error: Optional[BaseException] = None


_CHECKING = _Checking()


def check_eval_fn(eval_fn: Callable[[Any, Any], Any], params: Any,
                  model_state: Any) -> None:
  """Calls `eval_fn(params, model_state)` with every `evaluate` in it only
  traced on its first batch: a metric_fn that breaks the contract raises
  here (MetricShapeError, exit 2) before step 1.

  Within the check, `evaluate` returns {name: nan, 'num_examples': n}. An
  error of eval_fn's own code past that (it may test the values) is left
  to the real evaluation, where the values are real.
  """
  _CHECKING.active, _CHECKING.error = True, None
  try:
    eval_fn(params, model_state)
  except Exception as e:  # pylint: disable=broad-except
    if _CHECKING.error is not None:
      raise _CHECKING.error from None
    logging.debug(
        'eval_fn, called with traced evaluations only, raised '
        '%r; the evaluations will say more', e)
  finally:
    _CHECKING.active, _CHECKING.error = False, None


def _traced_only(step: Callable, params: Any, source: Any, layout: 'EvalLayout',
                 parallelism: parallelism_lib.Parallelism) -> dict[str, float]:
  """`step`'s trace on the first eval batch (metric_fn's contract checked),
  with nan for each metric it names."""
  ids, mask = next(
      eval_batches(len(source), layout, jax.process_index(),
                   jax.process_count()))
  batch = data_lib.read_batch(source, ids)
  try:
    shapes = jax.eval_shape(step, params, *parallelism.put_batch((batch, mask)))
  except Exception as e:
    _CHECKING.error = e
    raise
  return {
      **{
          k: float('nan') for k in _metric_names(shapes)
      }, 'num_examples': len(source)
  }


def _metric_names(sums: dict) -> list[str]:
  weights = {_WEIGHT.format(k) for k in sums}
  return [k for k in sums if k != 'num_examples' and k not in weights]


def evaluate(params: Any,
             metric_fn: MetricFn,
             source: Any,
             global_batch_size: int,
             parallelism: parallelism_lib.Parallelism,
             device_batch_limit: Optional[int] = None) -> dict[str, float]:
  """Scores every example once; returns example-weighted means (a Weighted
  metric's: its totals over its weights).

  Args:
    params: replicated parameters, or any replicated pytree that metric_fn
      takes first (as the training step keeps them).
    metric_fn: per-example metrics of one device's batch.
    source: the evaluation set, a data source as `runtime.data.read_batch`
      reads one.
    global_batch_size: examples per eval step, on any number of devices.
    parallelism: as the parameters were placed.
    device_batch_limit: the most rows a device takes in one pass (`plan`).

  Returns:
    {name: sum over examples / num_examples (a Weighted metric: sum of
    totals / sum of weights), ..., 'num_examples': int}.

  Example:
    >>> evaluate(state.params, metric_fn, test_source, 512, parallelism.PMAP)
    {'accuracy': 0.97..., 'loss': 0.09..., 'num_examples': 10001}
  """
  process_index, process_count = jax.process_index(), jax.process_count()
  layout = plan(global_batch_size, jax.device_count(), device_batch_limit)
  step = make_eval_step(metric_fn, parallelism)
  if _CHECKING.active:
    return _traced_only(step, params, source, layout, parallelism)
  num_examples = len(source)
  totals = None
  for ids, mask in eval_batches(num_examples, layout, process_index,
                                process_count):
    batch = data_lib.read_batch(source, ids)
    sums = step(params, *parallelism.put_batch((batch, mask)))
    # float64 on host: float32 would lose counts beyond 2**24 examples.
    sums = {k: np.float64(v) for k, v in parallelism.to_host(sums).items()}
    totals = sums if totals is None else {k: totals[k] + sums[k] for k in totals}
  if totals is None:
    raise AssertionError(f'no evaluation batch for {num_examples} examples')
  count = int(round(totals.pop('num_examples')))
  if count != num_examples:
    raise AssertionError(f'evaluated {count} examples, expected '
                         f'{num_examples}')
  return {
      **{
          k: totals[k] / totals.get(_WEIGHT.format(k), count) for k in _metric_names(totals)
      }, 'num_examples': count
  }
