"""Random numbers that belong to examples, not to devices or microbatches.

Each example of a step draws from a key of its own, folded from the step's
key and the example's position in the global batch (runtime/data.py's order,
padding last). A device or a microbatch only decides which examples it
computes, so dropout gives the same step on 1 x 8, 2 x 4 or 3 x 2 devices
and with any number of microbatches, and a run that shrinks or grows
(an elastic job) computes what an undisturbed one does.

Example:
  >>> keys = example_keys(step_key, first_position=64, rows=32)  # (32, 2)
  >>> x = dropout(keys, 0.5, x)                                  # (32, ...)
"""

import jax
import jax.numpy as jnp


def example_keys(step_key: jax.Array, first_position, rows: int) -> jax.Array:
  """The keys of `rows` consecutive examples of a step.

  Args:
    step_key: the step's raw key, uint32 (2,).
    first_position: the global batch position of the first example (a
      traced integer: a device's or a group's first row).
    rows: how many examples.

  Returns:
    uint32 (rows, 2): row i is `fold_in(step_key, first_position + i)`.
  """
  positions = first_position + jnp.arange(rows, dtype=jnp.uint32)
  return jax.vmap(lambda p: jax.random.fold_in(step_key, p))(positions)


def dropout(keys: jax.Array, rate: float, x: jax.Array) -> jax.Array:
  """Inverted dropout with a mask drawn per example from its own key.

  Args:
    keys: uint32 (n, 2), one key per example (what the step passes a
      loss_fn that asked for randomness).
    rate: the probability of dropping a value, in [0, 1).
    x: (n, ...) activations.

  Returns:
    x with each value kept with probability 1 - rate and scaled by
    1 / (1 - rate), shape and dtype of x.

  Example:
    >>> h = runtime.dropout(rng, 0.1, nnx.relu(dense(x)))
  """
  if not 0.0 <= rate < 1.0:
    raise ValueError(f'dropout rate {rate} must be in [0, 1)')
  if keys.shape[0] != x.shape[0]:
    raise ValueError(f'{keys.shape[0]} keys for {x.shape[0]} examples: '
                     'dropout takes one key per example (the rows of x)')
  if rate == 0.0:
    return x
  keep = jax.vmap(lambda k, row: jax.random.bernoulli(
      k, 1.0 - rate, row.shape))(keys, x)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))
