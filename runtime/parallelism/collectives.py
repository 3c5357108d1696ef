"""Which collectives over the batch axis a model's loss takes, read from its
jaxpr.

A loss that mixes rows of several devices inside the forward pass (Flax's
`nn.BatchNorm(axis_name=...)` sums every device's batch mean and variance;
any `lax.pmean(x, axis)` in the model) sees every row of every device,
padding rows included: a padded layout (runtime/parallelism/microbatches.py)
would change its values, not only cost a pass. The step's own pmean of the
gradients comes after the loss and is not the loss's.

Example:
  >>> def loss_fn(x):
  ...   return jax.lax.pmean(x.mean(), 'batch')
  >>> jaxpr = jax.make_jaxpr(loss_fn, axis_env=[('batch', 8)])(np.ones(4))
  >>> over_axis(jaxpr, 'batch')
  ('psum',)
"""

from typing import Any, Hashable, Iterator

from jax.extend import core

# Primitives that name an axis but move no value between devices: a device's
# index, and shard_map's marks of which values vary over an axis.
_NOT_MIXING = frozenset({'axis_index', 'pvary', 'pcast', 'pbroadcast'})


def _axes(params: dict) -> tuple:
  """The axis names an equation's parameters give it, as a flat tuple."""
  found: list = []
  for key in ('axes', 'axis_name'):
    value = params.get(key)
    if value is None:
      continue
    found.extend(value if isinstance(value, (tuple, list)) else (value,))
  return tuple(found)


def _inner(value: Any) -> Iterator[core.Jaxpr]:
  """The jaxprs inside one equation parameter (a scan's body, a cond's
  branches, a pjit's or custom_vjp's function)."""
  if isinstance(value, core.ClosedJaxpr):
    yield value.jaxpr
  elif isinstance(value, core.Jaxpr):
    yield value
  elif isinstance(value, (tuple, list)):
    for item in value:
      yield from _inner(item)


def over_axis(jaxpr: Any, axis: Hashable) -> tuple[str, ...]:
  """The names of the primitives in `jaxpr` (a Jaxpr or ClosedJaxpr, with
  every jaxpr nested in it) that move values between devices over `axis`,
  in the order first met, each once; () when there are none."""
  names: list[str] = []
  stack = list(_inner(jaxpr))
  while stack:
    for eqn in stack.pop().eqns:
      name = eqn.primitive.name
      if (name not in _NOT_MIXING and axis in _axes(eqn.params) and
          name not in names):
        names.append(name)
      for value in eqn.params.values():
        stack.extend(_inner(value))
  return tuple(names)
