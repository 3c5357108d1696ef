"""The data-parallel update step over every device of every process.

Parameters and optimiser state are replicated arrays without a stacked device
axis, the same on every device: the `pmean` makes the update identical
everywhere. The step runs as a pmap (the default) or as jit(shard_map) over a
mesh of all devices (`runtime/parallelism.py`); it is the same per-device
function either way. Place its batches with `parallelism.put_batch` and its
state with `replicate`.
"""

from typing import Any, Callable, NamedTuple

import jax
from jax import lax
import numpy as np
import optax

from runtime import parallelism as parallelism_lib

# The mesh / pmap axis that spans every device of every process.
DATA_AXIS = parallelism_lib.DATA_AXIS

# loss_fn(params, batch) -> (scalar loss, dict of scalar metrics), for one
# device's share of the batch; with rng, loss_fn(params, batch, rng).
LossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


class TrainState(NamedTuple):
  """Everything the next step depends on besides its batch.

  Attributes:
    params: the model's parameters.
    opt_state: the optimiser's state.
    rng: a raw uint32[2] PRNG key, split once per step, so a resumed run
      draws the same random numbers as one that never stopped.
  """
  params: Any
  opt_state: Any
  rng: Any


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation,
                    uses_rng: bool = False,
                    parallelism: str = parallelism_lib.PMAP) -> Callable:
  """Builds the data-parallel step `(state, batch) -> (state, metrics)`.

  Each device computes the loss and gradients of its share of the batch; the
  gradients and metrics are averaged with `lax.pmean` over `devices`, which
  spans all devices of all processes, and every device applies the same
  optimiser update. Since every device holds the same number of examples, the
  mean of the per-device means is the mean over the global batch.

  Args:
    loss_fn: `(params, batch) -> (loss, metrics)` for one device's examples.
    optimizer: an optax transformation.
    uses_rng: pass loss_fn a third argument, a PRNG key that differs per
      device and per step (for dropout and the like).
    parallelism: "pmap" or "shard_map".

  Returns:
    step(state, batch) with state a replicated `TrainState` and batch as
    `parallelism.put_batch` places it (pmap: leaves (local_devices,
    per_device_batch, ...); shard_map: global (global_batch, ...)); returns
    the new replicated state and a dict of replicated scalar metrics that
    includes 'loss'. The input state is donated.

  Example:
    >>> step = make_train_step(loss_fn, optax.sgd(0.1))
    >>> state, metrics = step(state, put_batch(batch, 'pmap'))
  """
  axis_name = DATA_AXIS
  def step(state: TrainState, batch: Any):
    rng, step_rng = jax.random.split(state.rng)
    extra = ()
    if uses_rng:
      extra = (jax.random.fold_in(step_rng, lax.axis_index(axis_name)),)
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, batch, *extra)
    grads = lax.pmean(grads, axis_name)
    metrics = lax.pmean({**metrics, 'loss': loss}, axis_name)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(params, opt_state, rng), metrics

  return parallelism_lib.map_over_devices(
      step, parallelism, in_axes=(None, 0), out_axes=(None, None),
      donate_argnums=(0,))


def replicate(tree: Any, parallelism: str = parallelism_lib.PMAP) -> Any:
  """Places a pytree on the devices it is replicated over, as the step keeps it.

  Starting from this layout, rather than from single-device arrays, saves one
  recompilation of the step after its first call.

  Example:
    >>> state = replicate(init_state(params, optimizer))
  """
  return parallelism_lib.replicate(tree, parallelism)


def init_state(params: Any, optimizer: optax.GradientTransformation,
               seed: int = 0) -> TrainState:
  """Fresh optimiser state and RNG key for `params`, on host (numpy).

  Pass the result to `replicate` to train with it.
  """
  rng = np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32)
  return jax.device_get(TrainState(params, optimizer.init(params), rng))
