"""Trees that must keep their shape from step to step, checked at trace time.

A step returns the state the next step takes. If the model state (or the
optimiser's updates, or its state) comes back with another structure, shape
or dtype, every step compiles anew, slowly and silently, and the run fails
much later far from the cause. `check_same` compares the two trees while the
step is traced, so the mistake is named before anything runs; a
`RecompileWatch` names what changed when a step compiles again later anyway.

Example:
  >>> check_same('model_state', old_model_state, new_model_state)
  StructureError: model_state changed its structure in the step:
    - ['batch_stats']['mean']: float32[32] -> (missing)
    - ['params']['w']: (absent) -> float32[3]
"""

from typing import Any, Callable

from absl import logging
import jax
import numpy as np

from runtime.common import exit_codes
from runtime.common import mappings
from runtime import compile_events

# A leaf the new tree lacks.
_MISSING = '(missing)'


class StructureError(exit_codes.PodrunError, TypeError):
  """A tree the step returns differs from the one it took."""
  exit_code = exit_codes.FAILED


def _describe(leaf: Any, dtypes: bool) -> str:
  dtype = getattr(leaf, 'dtype', None)
  shape = getattr(leaf, 'shape', np.shape(leaf))
  name = (np.dtype(dtype).name if dtype is not None else getattr(
      leaf, 'type_name',
      type(leaf).__name__))
  return f'{name if dtypes else ""}[{",".join(map(str, shape))}]'


def _leaves(tree: Any, dtypes: bool) -> dict[str, str]:
  return {
      jax.tree_util.keystr(path): _describe(leaf, dtypes)
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
  }


def differences(old: Any, new: Any, dtypes: bool = True) -> list[str]:
  """'path: old -> new' for each leaf added, removed, reshaped or (with
  `dtypes`) of another dtype."""
  lines = [
      f'{path or "(the root)"}: {was} -> {now}' for path, was, now in
      mappings.changes(_leaves(old, dtypes), _leaves(new, dtypes), _MISSING)
  ]
  was, now = jax.tree_util.tree_structure(old), jax.tree_util.tree_structure(
      new)
  # jaxlib's stub leaves PyTreeDef's == undeclared; it compares structure.
  if not lines and was != now:  # type: ignore[operator]
    lines.append(f'the container types: {was} -> {now}')
  return lines


def check_same(what: str,
               old: Any,
               new: Any,
               hint: str = '',
               dtypes: bool = True) -> None:
  """Raises StructureError naming every path of `new` that differs from `old`.

  Args:
    what: the tree's name in the message ('model_state', ...).
    old: what the step took (tracers or arrays).
    new: what it returns.
    hint: a sentence on the usual cause.
    dtypes: compare dtypes too (optax casts updates to the parameters'
      dtypes, so updates are compared without).
  """
  lines = differences(old, new, dtypes)
  if lines:
    raise StructureError(
        f'{what} changed its structure in the step ({len(lines)} '
        'difference(s)); every step would compile anew:\n  - ' +
        '\n  - '.join(lines) + (f'\n{hint}' if hint else ''))


def _describe_argument(leaf: Any) -> str:
  text = _describe(leaf, dtypes=True)
  if getattr(leaf, 'weak_type', False):
    text += ' (weak type)'
  sharding = getattr(leaf, 'sharding', None)
  return f'{text} {sharding}' if sharding is not None else text


def _arguments(args: Any) -> dict[str, str]:
  return {
      jax.tree_util.keystr(path): _describe_argument(leaf)
      for path, leaf in jax.tree_util.tree_leaves_with_path(args)
  }


class _Leaf:
  """What a compilation depends on of one argument, without its buffer."""
  __slots__ = ('shape', 'dtype', 'weak_type', 'sharding', 'type_name')

  def __init__(self, shape, dtype, weak_type, sharding, type_name):
    self.shape, self.dtype = shape, dtype
    self.weak_type, self.sharding = weak_type, sharding
    self.type_name = type_name


def _signature(args: tuple) -> tuple[Any, list[tuple]]:
  """The arguments' tree and each leaf's (shape, dtype, weak type,
  sharding): holds no array alive (one batch more on the accelerator
  otherwise). Plain tuples: this runs on every step."""
  leaves, treedef = jax.tree_util.tree_flatten(args)
  return treedef, [(l.shape if hasattr(l, 'shape') else np.shape(l),
                    getattr(l, 'dtype', None), getattr(l, 'weak_type', False),
                    getattr(l, 'sharding', None), type(l).__name__)
                   for l in leaves]


def _described(signature: tuple[Any, list[tuple]]) -> dict[str, str]:
  treedef, leaves = signature
  return _arguments(
      jax.tree_util.tree_unflatten(treedef, [_Leaf(*leaf) for leaf in leaves]))


class RecompileWatch:
  """A step function that warns, once, when a call after the second compiles.

  The first call compiles, and the second may (the state comes back from the
  first step in the step's own layout); any later compilation costs a full
  compile on every process and usually means an argument changed its shape,
  dtype, weak type or placement. The warning names the arguments that
  differ from the second call's.

  Example:
    >>> step = RecompileWatch(make_train_step(...))
    >>> state, metrics = step(state, batch)
  """

  def __init__(self, step_fn: Callable, name: str = 'the train step'):
    self._fn, self._name = step_fn, name
    self._calls, self._previous, self.warned = 0, None, False
    compile_events.listen()

  def __call__(self, *args):
    before = compile_events.count_in_this_thread()
    out = self._fn(*args)
    self._calls += 1
    compiled = compile_events.count_in_this_thread() > before
    if self._calls > 2 and not self.warned and compiled:
      self.warned = True
      logging.warning('%s', self._message(args))
    if self._calls <= 2:
      # The arguments every later call should match. Read once, not every
      # call: a big state's leaves cost the host time each step otherwise.
      self._previous = _signature(args)
    return out

  def _message(self, args: tuple) -> str:
    assert self._previous is not None  # Only a call after the first differs.
    changed = [
        f'{path}: {was} -> {now}' for path, was, now in mappings.changes(
            _described(self._previous), _arguments(args), _MISSING)
    ]
    what = ('; '.join(changed[:5]) +
            (f'; and {len(changed) - 5} more' if len(changed) > 5 else '')
            if changed else 'no argument changed its shape, dtype or '
            'placement (a new trace, or an evicted cache entry)')
    return (f'{self._name} compiled again at call {self._calls}, after the '
            f'first steps: every process pays a full compilation. What '
            f'changed since the second call: {what}')
