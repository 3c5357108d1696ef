"""The loss function's contract, checked where it is first called: its
signature for the model state and key it takes, what it returns (a scalar
loss and a dict of scalar metrics, and the model state's structure back),
and a metric named `loss` that is the returned loss.

Example:
  >>> check_loss_fn(loss_fn, uses_rng=False, has_model_state=False)
  >>> checked = checked_output(loss_fn, has_model_state=False, axis='devices')
"""

import inspect
import re
from typing import Any, Callable, Mapping, Optional

import jax

from runtime.common import exit_codes
from runtime import weighted

# Without model state: loss_fn(params, batch[, rng]) -> (loss, metrics).
# With it: loss_fn(params, model_state, batch[, rng])
#   -> (loss, (metrics, new_model_state)).
# Both on one device's share of the batch; loss and metrics are scalars,
# or each a runtime.Weighted(total, weight) of scalars, reduced over the
# whole step before dividing (runtime/weighted.py).
LossFn = Callable[..., tuple[jax.Array, Any]]
MODEL_STATE_HINT = (
    'loss_fn must return the new model state with the structure of the one '
    'it was given: with Flax linen, `updates["batch_stats"]` rather than the '
    'whole `updates` dict of `apply(..., mutable=["batch_stats"])`.')


def loss_fn_signatures() -> str:
  """The four shapes a loss_fn may take, for error messages."""
  return ('loss_fn(params, batch) -> (loss, metrics); with Task.rng (or '
          'loss_uses_rng), loss_fn(params, batch, rng); with model state, '
          'loss_fn(params, '
          'model_state, batch) -> (loss, (metrics, new_model_state)); with '
          'both, loss_fn(params, model_state, batch, rng)')


def check_loss_fn(loss_fn: LossFn, uses_rng: bool,
                  has_model_state: bool) -> None:
  """Raises ConfigError when loss_fn cannot take the arguments it will get.

  Functions whose signature Python cannot read, or that take *args, pass.
  """
  try:
    parameters = inspect.signature(loss_fn).parameters.values()
  except (TypeError, ValueError):
    return
  kinds = [p.kind for p in parameters]
  if inspect.Parameter.VAR_POSITIONAL in kinds:
    return
  positional = [
      p for p in parameters
      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
  ]
  required = [p for p in positional if p.default is p.empty]
  given = 2 + int(uses_rng) + int(has_model_state)
  if not len(required) <= given <= len(positional):
    names = ', '.join(p.name for p in positional)
    raise exit_codes.ConfigError(
        f'loss_fn({names}) takes {len(positional)} positional argument(s), '
        f'but the step calls it with {given} (model state: '
        f'{"yes" if has_model_state else "no"}, rng: '
        f'{"yes" if uses_rng else "no"}; Task.model_state and Task.rng '
        f'(or Task.loss_uses_rng) decide). The signatures: '
        f'{loss_fn_signatures()}.')


def _describe_output(value: Any) -> str:
  if isinstance(value, tuple):
    return f'a tuple of {len(value)}'
  shape = getattr(value, 'shape', None)
  if shape is not None:
    return f'an array of shape {tuple(shape)}'
  return f'a {type(value).__name__}'


def checked_output(loss_fn: LossFn, has_model_state: bool, axis: Any) -> LossFn:
  """loss_fn, refusing at trace time an output of another form than
  (loss, metrics), or (loss, (metrics, new_model_state)), with a scalar loss.

  Without this a bare loss fails deep inside JAX's value_and_grad.
  """
  want = ('(loss, (metrics, new_model_state))'
          if has_model_state else '(loss, metrics)')

  def refuse(got: str):
    raise exit_codes.ConfigError(
        f'loss_fn returned {got}; it must return {want} with a scalar loss '
        'and a dict of scalar metrics ({} for none). The signatures: '
        f'{loss_fn_signatures()}.')

  def checked(*args):
    try:
      out = loss_fn(*args)
    except NameError as e:
      unbound = re.search(r'unbound axis name: (\w+)', str(e))
      if unbound is None:
        raise
      fix = (f'set config.axis_name={unbound[1]!r} to map the step over '
             'that name' if isinstance(axis, str) else
             f'name that axis in the model: lax.pmean(x, {axis!r})')
      raise exit_codes.ConfigError(
          f'loss_fn uses the axis name {unbound[1]!r} (a collective such as '
          f'lax.pmean(x, {unbound[1]!r}), or Flax\'s nn.BatchNorm(axis_name='
          f'{unbound[1]!r})), which the step does not bind: podrun maps the '
          f'step over the devices on the axis {axis!r}. Either {fix}, or '
          f'use {axis!r} in the model.') from None
    if isinstance(out, weighted.Weighted):
      refuse('a bare Weighted; a weighted loss goes first: '
             '(Weighted(total, weight), metrics)')
    if not isinstance(out, tuple) or len(out) != 2:
      refuse(_describe_output(out))
    part, shape = _not_scalar(out[0])
    if shape is not None:
      refuse(f'a loss{part} of shape {shape}')
    aux = out[1]
    if has_model_state and (not isinstance(aux, tuple) or len(aux) != 2):
      refuse(f'(loss, {_describe_output(aux)})')
    metrics = aux[0] if has_model_state else aux
    _check_metrics(metrics, want)
    _check_loss_metric(metrics, out[0])
    return out

  return checked


def _check_metrics(metrics: Any, want: str) -> None:
  """Refuses metrics that are not a mapping of scalars, with the fix."""
  if not isinstance(metrics, Mapping):
    got = _describe_output(metrics)
    hint = (' Flax\'s examples return (loss, logits): compute the metrics '
            'from the logits inside loss_fn and return (loss, {\'accuracy\': '
            '...}).' if getattr(metrics, 'ndim', 0) >= 1 else '')
    raise exit_codes.ConfigError(
        f'loss_fn returned (loss, {got}) where {want} needs a dict of '
        f'scalar metrics ({{}} for none).{hint}')
  for name, value in metrics.items():
    part, shape = _not_scalar(value)
    if shape is not None:
      raise exit_codes.ConfigError(
          f'loss_fn\'s metric {name!r}{part} has shape {shape}; metrics must be scalars, each '
          'a mean over the device\'s examples (podrun averages them over '
          'the devices), or runtime.Weighted(total, weight) of scalars '
          '(podrun sums both over the step, then divides). Return its mean '
          'or its sum and weight, or score per-example values in '
          'evaluation: runtime.evaluate\'s metric_fn returns them per '
          'example.')


def _not_scalar(value: Any) -> tuple[str, Optional[tuple]]:
  """('', None) for a scalar or a Weighted of scalars; else which part is
  not (' (its Weighted total)', or '' for a plain value) and its shape."""
  pairs = (('total', value.total), ('weight', value.weight)) if isinstance(
      value, weighted.Weighted) else (('', value),)
  for part, x in pairs:
    shape = tuple(getattr(x, 'shape', ()))
    if shape != ():
      return (f' (its Weighted {part})' if part else ''), shape
  return '', None


def _check_loss_metric(metrics: Mapping, loss: Any) -> None:
  """Refuses a metric named 'loss' that is not loss_fn's loss itself: the
  step logs the loss it differentiates under that name, and would replace
  the metric without a word."""
  if 'loss' in metrics and metrics['loss'] is not loss:
    raise exit_codes.ConfigError(
        "loss_fn's metrics hold 'loss', a value other than the loss it "
        "returns; podrun logs the returned loss (the one it differentiates, "
        "weight decay and all) as 'loss', so the metric would be replaced. "
        "Rename the metric (Flax's examples: metrics['loss'] is the "
        "cross-entropy; call it 'cross_entropy'), or return the loss itself "
        "under that name.")
