"""A value given as a sum and the weight it sums over, reduced once.

A language model's loss is the summed loss of the real target tokens over
their count in the whole global batch (t5x, MaxText, Flax's LM1B). A mean
taken on each device and averaged over the devices is another figure
wherever the devices hold different counts, and so is one divided by a
`lax.psum` of the counts once a device runs more than one pass (microbatches,
or an elastic shrink that keeps the group size). Given as `Weighted(total,
weight)`, the step sums both over every pass, microbatch and device of the
step and divides once: the same figure on any layout, padding groups
counting nothing.

A plain scalar counts its group once: the mean over the step's real groups,
as before.

Example:
  >>> def loss_fn(params, batch):
  ...   losses = cross_entropy(model(params, batch['inputs']), batch['targets'])
  ...   tokens = (batch['targets'] > 0).astype(jnp.float32)
  ...   return runtime.Weighted((losses * tokens).sum(), tokens.sum()), {
  ...       'accuracy': runtime.Weighted((hits * tokens).sum(), tokens.sum())}
"""

from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp


class Weighted(NamedTuple):
  """A sum and what it sums over; its value is total / weight, taken after
  both are summed over the whole step (or the whole evaluation).

  Attributes:
    total: the sum, a scalar (per example, (n,), in `runtime.evaluate`).
    weight: the count or weight the sum is over (for an LM, the real target
      tokens), the same shape; no gradient flows through it.
  """
  total: Any
  weight: Any


def parts(value: Any) -> Weighted:
  """`value` as a Weighted: itself (its weight float32, held constant), or a
  plain value with weight None, which counts its group once and leaves no
  leaf to sum (pytrees skip None), so a plain mean is divided by the static
  count of groups, bit for bit the step of before."""
  if isinstance(value, Weighted):
    weight = lax.stop_gradient(jnp.asarray(value.weight, jnp.float32))
    return Weighted(value.total, weight)
  return Weighted(value, None)


def value(summed: Weighted, groups: Any) -> Any:
  """total / weight, or total / groups for a plain value (weight None)."""
  return divided(summed.total,
                 groups if summed.weight is None else summed.weight)


def divided(x: Any, weight: Any) -> Any:
  """x / weight; for a weight that is an array, computed in float32 or
  wider, in x's float dtype, and 0 where the weight is 0 (a step whose
  batch held no real token changes nothing)."""
  if isinstance(weight, (int, float)):
    return x / weight
  x = jnp.asarray(x)
  dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
  safe = jnp.where(weight > 0, weight, 1)
  return (x / safe).astype(dtype)


def is_weighted(value: Any) -> bool:
  return isinstance(value, Weighted)


def any_weighted(loss: Any, metrics: Any) -> bool:
  """Whether a loss_fn's loss or any of its metrics is Weighted."""
  return is_weighted(loss) or any(
      is_weighted(v)
      for v in jax.tree_util.tree_leaves(metrics, is_leaf=is_weighted))
