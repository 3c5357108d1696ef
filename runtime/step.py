"""The data-parallel update step: one pmap over every device of every process.

Parameters and optimiser state are passed with `in_axes=None` and returned with
`out_axes=None`: they are replicated arrays without a stacked device axis, the
same on every device (the `pmean` makes the update identical everywhere, and
`out_axes=None` has JAX check that the outputs do not vary over the axis).
Batches carry a leading local-device axis (see `sharding.split_for_devices`).
"""

from typing import Any, Callable, NamedTuple

import jax
from jax import lax
import numpy as np
import optax

# The pmap axis that spans every device of every process.
DATA_AXIS = 'devices'

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
                    axis_name: str = DATA_AXIS, uses_rng: bool = False
                    ) -> Callable:
  """Builds the pmap'd step `(state, batch) -> (state, metrics)`.

  Each device computes the loss and gradients of its share of the batch; the
  gradients and metrics are averaged with `lax.pmean` over `axis_name`, which
  spans all devices of all processes, and every device applies the same
  optimiser update. Since every device holds the same number of examples, the
  mean of the per-device means is the mean over the global batch.

  Args:
    loss_fn: `(params, batch) -> (loss, metrics)` for one device's examples.
    optimizer: an optax transformation.
    axis_name: the pmap axis name.
    uses_rng: pass loss_fn a third argument, a PRNG key that differs per
      device and per step (for dropout and the like).

  Returns:
    step(state, batch) with state a replicated `TrainState` and batch leaves of
    shape (local_devices, per_device_batch, ...); returns the new replicated
    state and a dict of replicated scalar metrics that includes 'loss'. The
    input state is donated.

  Example:
    >>> step = make_train_step(loss_fn, optax.sgd(0.1))
    >>> state, metrics = step(state, split_for_devices(batch, 8))
  """
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

  return jax.pmap(step, axis_name=axis_name, in_axes=(None, 0),
                  out_axes=(None, None), donate_argnums=(0,))


def replicate(tree: Any) -> Any:
  """Places a pytree on every local device, the layout the step returns.

  Starting from this layout, rather than from single-device arrays, saves one
  recompilation of the step after its first call.

  Example:
    >>> state = replicate(TrainState(params, optimizer.init(params)))
  """
  mesh = jax.sharding.Mesh(np.array(jax.local_devices()), (DATA_AXIS,))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.device_put(tree, sharding)


def init_state(params: Any, optimizer: optax.GradientTransformation,
               seed: int = 0) -> TrainState:
  """Fresh optimiser state and RNG key for `params`, on host (numpy).

  Pass the result to `replicate` to train with it.
  """
  rng = np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32)
  return jax.device_get(TrainState(params, optimizer.init(params), rng))
