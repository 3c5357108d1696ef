"""Parameters that count what was trained: exactly-once as an equality.

A regression's final weights forget: a step trained twice or skipped moves
them by less than any tolerance a test can hold. The census adds to a task
parameters that never forget. Its loss term is linear, trained by SGD at
learning rate 1 (its own optimiser, `optax.multi_transform`), and scaled so
that every appearance of example i in an applied step adds exactly 1 to
`census['examples'][i]` and every applied step adds exactly 1 to
`census['steps']`, on any topology, microbatches and padding:

- a group of m examples contributes -(G / m) x sum(w[ids]) - steps; the step
  averages over the G / m real groups (runtime/step.py), so w[i] gets the
  integer count of i and `steps` gets 1. Every value is an integer below
  2**24 and every division by G / m divides an exact multiple of it, so
  float32 holds them exactly;
- the task's own loss and gradients are unchanged (the term adds nothing to
  the reported loss: x - stop_gradient(x)).

Example:
  >>> task = census.add(task, global_batch_size=256)
  >>> counts = census.counts(helpers.final_state(workdir)['params'])
  >>> np.array_equal(counts.examples, census.expected(256, 4096, 0, 60))
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from runtime import data as data_lib

KEY = 'census'


class Counts(NamedTuple):
  """What a run trained: examples (num_examples,) and steps, as integers."""
  examples: np.ndarray
  steps: int


def _with_ids(source):
  """The source, each batch with its examples' ids in 'census_id'."""
  read = functools.partial(data_lib.read_batch, source)

  class WithIds:

    def __len__(self):
      return len(source)

    def read_batch(self, ids):
      return {**read(ids), 'census_id': np.asarray(ids, np.int32)}

    def __getitem__(self, index):  # One example, for its shapes.
      return {**source[index], 'census_id': np.int32(index)}

  return WithIds()


def _counting(loss_fn, global_batch_size: int):

  def loss(params, batch, *rest):
    value, aux = loss_fn({
        k: v for k, v in params.items() if k != KEY
    }, {
        k: v for k, v in batch.items() if k != 'census_id'
    }, *rest)
    counts = params[KEY]
    rows = batch['census_id'].shape[0]
    term = -(global_batch_size / rows) * jnp.sum(
        counts['examples'][batch['census_id']]) - counts['steps']
    return value + (term - jax.lax.stop_gradient(term)), aux

  return loss


def add(task: Any, global_batch_size: int) -> Any:
  """`task` (a runtime.Task without model state) with a census of what it
  trains, zero at the start."""
  params = {
      **task.params, KEY: {
          'examples': np.zeros(len(task.data), np.float32),
          'steps': np.float32(0.0)
      }
  }
  labels = {k: (KEY if k == KEY else 'task') for k in params}
  optimizer = optax.multi_transform(
      {
          'task': task.optimizer,
          KEY: optax.sgd(1.0)
      }, labels)
  return dataclasses.replace(task,
                             params=params,
                             optimizer=optimizer,
                             loss_fn=_counting(task.loss_fn, global_batch_size),
                             data=_with_ids(task.data))


def counts(params: Any) -> Counts:
  """The census of trained parameters (a checkpoint's, as numpy), checked
  to be whole numbers."""
  examples = np.asarray(params[KEY]['examples'])
  steps = np.asarray(params[KEY]['steps'])
  whole = np.round(examples)
  assert np.array_equal(whole, examples) and float(steps).is_integer(), (
      'the census holds a fraction: a step was averaged over the wrong count',
      examples[whole != examples][:10], steps)
  return Counts(whole.astype(np.int64), int(steps))


def expected(global_batch_size: int,
             num_examples: int,
             seed: int,
             steps: int,
             shuffle: bool = True) -> np.ndarray:
  """How often each example appears in steps 0 .. steps - 1 of the data
  order (runtime/data.py): (num_examples,) int64."""
  ids = [
      data_lib.global_batch_ids(s, global_batch_size, num_examples, seed,
                                shuffle) for s in range(steps)
  ]
  return np.bincount(np.concatenate(ids), minlength=num_examples)


def assert_exactly_once(params: Any,
                        straight_params: Any,
                        global_batch_size: int,
                        num_examples: int,
                        steps: int,
                        seed: int = 0) -> None:
  """Nothing trained twice or lost, as an equality of counts: the census of
  `params` (a disturbed run's) equals the undisturbed run's and what the
  data order says of `steps` steps."""
  trained = counts(params)
  assert trained.steps == steps, (trained.steps, steps)
  np.testing.assert_array_equal(trained.examples,
                                counts(straight_params).examples)
  np.testing.assert_array_equal(
      trained.examples, expected(global_batch_size, num_examples, seed, steps))
