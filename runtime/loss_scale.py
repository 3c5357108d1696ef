"""A dynamic loss scale for half-precision training, step for step Flax's
`flax.training.dynamic_scale.DynamicScale`.

In float16 small gradients flush to zero. The step multiplies the loss by a
scale before differentiating, and divides each device's gradients (cast to
float32) by it before they are averaged over the devices (runtime/step.py).
Then, on the averaged gradients, this module's optimiser wrapper:

- applies the update only where every gradient is finite (else the
  parameters and the optimiser state stay as they were, the step counted);
- after `growth_interval` finite steps in a row, multiplies the scale by
  `growth_factor`; after a step with a non-finite gradient, multiplies it by
  `backoff_factor` (at least `minimum_scale`).

The scale lives in the optimiser state (`ScaleState`), so it is checkpointed
and a resumed run goes on with it. A workload asks for it with
`Task(loss_scale=runtime.DynamicScale())`; the step then logs `loss_scale`
(the scale after the step, as Flax's example logs it) and
`loss_scale_skipped` (1 for a skipped step), and a non-finite loss in a step
it skipped does not stop the job (runtime/loop.py).

Example:
  >>> task = runtime.Task(..., optimizer=optax.sgd(0.1),
  ...                     loss_scale=runtime.DynamicScale())
"""

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax


@dataclasses.dataclass(frozen=True)
class DynamicScale:
  """The loss scale's settings: Flax's names and defaults.

  Attributes:
    growth_factor: the scale's factor after growth_interval finite steps.
    backoff_factor: its factor after a step with a non-finite gradient.
    growth_interval: finite steps in a row before the scale grows.
    scale: the first scale.
    minimum_scale: the least the scale backs off to (None: no bound).
  """
  growth_factor: float = 2.0
  backoff_factor: float = 0.5
  growth_interval: int = 2000
  scale: float = 65536.0
  minimum_scale: Optional[float] = float(np.finfo(np.float32).tiny)


class ScaleState(NamedTuple):
  """The optimiser state of a loss-scaled run.

  Attributes:
    scale: float32 (), the scale the next step multiplies the loss by.
    fin_steps: int32 (), finite steps in a row since the scale last changed.
    finite: bool (), whether the last step's gradients were all finite (it
      was applied).
    inner: the wrapped optimiser's state.
  """
  scale: Any
  fin_steps: Any
  finite: Any
  inner: Any


def scaled(loss_fn, scale):
  """loss_fn with its loss (the first output) multiplied by `scale`."""

  def call(*args):
    loss, aux = loss_fn(*args)
    return scale * loss, aux

  return call


def unscaled(loss, grads, scale):
  """(loss / scale, each gradient cast to float32 and divided by scale):
  what `jax.value_and_grad` of `scaled` gives, back in the loss's units."""
  return loss / scale, jax.tree_util.tree_map(
      lambda g: jnp.asarray(g, jnp.float32) / scale, grads)


def _all_finite(tree) -> jax.Array:
  finite = jnp.array(True)
  for leaf in jax.tree_util.tree_leaves(tree):
    finite &= jnp.all(jax.lax.is_finite(leaf))
  return finite


def wrap(optimizer: optax.GradientTransformation,
         settings: DynamicScale) -> optax.GradientTransformation:
  """`optimizer` under a dynamic loss scale: it takes the unscaled, averaged
  gradients and returns zero updates (its own state unchanged) where any is
  not finite, and keeps the scale in its state (`ScaleState`)."""

  def init(params):
    return ScaleState(np.float32(settings.scale), np.int32(0), np.bool_(True),
                      optimizer.init(params))

  def update(grads, state: ScaleState, params=None):
    finite = _all_finite(grads)
    updates, inner = optimizer.update(grads, state.inner, params)
    updates = jax.tree_util.tree_map(
        lambda u: jnp.where(finite, u, jnp.zeros_like(u)), updates)
    inner = jax.tree_util.tree_map(lambda new, old: jnp.where(finite, new, old),
                                   inner, state.inner)
    grow = state.fin_steps == settings.growth_interval
    grown = jnp.where(
        grow & finite,
        jnp.minimum(state.scale * settings.growth_factor,
                    jnp.finfo(jnp.float32).max), state.scale)
    backed_off = state.scale * settings.backoff_factor
    if settings.minimum_scale is not None:
      backed_off = jnp.maximum(backed_off, settings.minimum_scale)
    scale = jnp.where(finite, grown, backed_off).astype(jnp.float32)
    fin_steps = jnp.where(grow | ~finite, 0,
                          state.fin_steps + 1).astype(jnp.int32)
    return updates, ScaleState(scale, fin_steps, finite, inner)

  return optax.GradientTransformation(init, update)


def kept_where_skipped(state: ScaleState, new_params, params):
  """The parameters after a step: `new_params` where it was applied, else
  `params` to the bit (zero updates alone would turn -0.0 into 0.0)."""
  return jax.tree_util.tree_map(
      lambda new, old: jnp.where(state.finite, new, old), new_params, params)


def metrics(state: ScaleState) -> dict[str, jax.Array]:
  """The step's loss-scale metrics, from the state after it."""
  return {
      'loss_scale': state.scale,
      'loss_scale_skipped': 1.0 - state.finite.astype(jnp.float32)
  }
