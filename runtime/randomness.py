"""The random keys a loss_fn gets, by the contract its task chose.

`Task(rng='example')`: each example of a step draws from a key of its own,
folded from the step's key and the example's position in the global batch
(runtime/data.py's order, padding last). A device or a microbatch only
decides which examples it computes, so dropout gives the same step on
1 x 8, 2 x 4 or 3 x 2 devices and with any number of microbatches, and a
run that shrinks or grows (an elastic job) computes what an undisturbed
one does. `dropout` drops per example; `per_example` runs a forward pass
whose layers take one key (Flax's nnx.Dropout, linen's Dropout) once per
example, each with its own.

`Task(rng='device')` (what `loss_uses_rng=True` means): one key for each
call of loss_fn, folded from the step's key and the call's place (its
device, its microbatch), what every layer of the field takes as it is;
its dropout then changes with the number of devices and microbatches.

Example:
  >>> keys = example_keys(step_key, first_position=64, rows=32)  # (32, 2)
  >>> x = dropout(keys, 0.5, x)                                  # (32, ...)
"""

import re
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from runtime.common import exit_codes

DEVICE, EXAMPLE = 'device', 'example'
CONTRACTS = (DEVICE, EXAMPLE)
# What jax.random, runtime.dropout and Flax say of a key of the wrong shape.
_KEY_ERROR = re.compile(
    r'accepts a single key|key array of shape|keys? for '
    r'\d+ examples|PRNG key|key_data|random key', re.IGNORECASE)


def contract(rng: Optional[str], loss_uses_rng: bool) -> Optional[str]:
  """The task's contract: `rng` if given, else DEVICE for loss_uses_rng (its
  meaning before per-example keys), else None (loss_fn takes no rng).

  Raises:
    exit_codes.ConfigError: for another value of `rng`.
  """
  if rng is None:
    return DEVICE if loss_uses_rng else None
  if rng not in CONTRACTS:
    raise exit_codes.ConfigError(
        f'Task(rng={rng!r}): use rng=\'example\' (a key per example, the '
        'same on any layout) or rng=\'device\' (one key per call of '
        'loss_fn, what Flax\'s dropout layers take as they are)')
  return rng


def describe(chosen: str) -> str:
  """What a loss_fn under contract `chosen` gets, for messages."""
  if chosen == EXAMPLE:
    return ('rng=\'example\': one key per example, uint32 (n, 2) for the n '
            'examples of the call')
  return 'rng=\'device\': one key per call of loss_fn, uint32 (2,)'


def keys_for(chosen: Optional[str], step_key: jax.Array, call_index,
             first_position, rows: int) -> tuple:
  """loss_fn's last arguments under contract `chosen`: () for none, the
  call's key (uint32 (2,), from its global call index: device x groups +
  group) or its examples' keys (uint32 (rows, 2))."""
  if chosen is None:
    return ()
  if chosen == DEVICE:
    return (jax.random.fold_in(step_key, call_index),)
  return (example_keys(step_key, first_position, rows),)


def explained(loss_fn: Callable, chosen: Optional[str]) -> Callable:
  """loss_fn, with an error it raises on the key it was given (at trace
  time, so before step 1) named as a mismatch of contracts.

  Raises (from the returned function):
    exit_codes.ConfigError: naming the contract, the key's shape and the
      other choice.
  """
  if chosen is None:
    return loss_fn

  def call(*args):
    try:
      return loss_fn(*args)
    except (ValueError, TypeError) as e:
      if not _KEY_ERROR.search(str(e)):
        raise
      shape = tuple(getattr(args[-1], 'shape', ()))
      raise exit_codes.ConfigError(_mismatch(chosen, shape, e)) from e

  return call


def _mismatch(chosen: str, shape: tuple, error: Exception) -> str:
  other = DEVICE if chosen == EXAMPLE else EXAMPLE
  head = (f'loss_fn failed on its rng, uint32 {shape}: {type(error).__name__}: '
          f'{str(error).splitlines()[0].rstrip(".")}. The task chose '
          f'{describe(chosen)}.')
  if chosen == EXAMPLE:
    return (f'{head} Layers that take one key (Flax\'s nnx.Dropout and '
            'nnx.Rngs, linen\'s Dropout, jax.random.*) need Task('
            f'rng=\'{other}\') (one key per call; dropout then changes with '
            'the number of devices and microbatches), or keep rng=\'example\' '
            'and run the forward pass once per example with '
            'runtime.per_example (docs/workloads.md, Randomness).')
  return (f'{head} runtime.dropout and rng[i] take one key per example: '
          f'choose Task(rng=\'{other}\') (docs/workloads.md, Randomness).')


def per_example(forward: Callable[..., Any]) -> Callable[..., Any]:
  """Runs `forward` once per example, each with its own key, so that layers
  that take one key (Flax's nnx.Dropout, linen's Dropout) draw per example
  under Task(rng='example'), the same on any layout.

  Args:
    forward: `forward(key, *inputs) -> outputs`, on inputs with a leading
      batch axis of 1 (as a model's batch of one) and key uint32 (2,).
      Its layers must not mix examples (BatchNorm in training does: keep
      runtime.dropout for such a model).

  Returns:
    `run(keys, *inputs) -> outputs`: keys uint32 (n, 2), inputs and outputs
    pytrees with a leading axis of n (`jax.vmap` over the examples).

  Example:
    >>> def loss_fn(params, batch, rng):                # rng: (n, 2)
    ...   model = nnx.merge(graphdef, params)
    ...   logits = runtime.per_example(
    ...       lambda key, x: model(x, rngs=nnx.Rngs(dropout=key)))(
    ...           rng, batch['tokens'])
  """

  def one(key, *inputs):
    outputs = forward(key, *jax.tree_util.tree_map(lambda x: x[None], inputs))
    return jax.tree_util.tree_map(lambda y: y[0], outputs)

  def run(keys, *inputs):
    return jax.vmap(one)(keys, *inputs)

  return run


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
  keep = jax.vmap(
      lambda k, row: jax.random.bernoulli(k, 1.0 - rate, row.shape))(keys, x)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))
