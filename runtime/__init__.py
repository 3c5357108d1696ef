"""podrun's runtime: what a workload imports to train on every device.

A workload is a function `(config, workdir)` that builds a `Task` and calls
`train`. Everything it needs is here:

  Task, TrainResult          what a workload gives and gets (runtime/task.py)
  train                      the loop (runtime/training.py)
  ArraySource                random access to arrays (runtime/data.py)
  evaluate                   exact evaluation over every device
                             (runtime/evaluation.py)
  PodrunError, ConfigError   raise them to end the job with a chosen exit code
  Preempted, CheckpointError what `train` raises after a preemption's save,
                             and for a checkpoint it cannot use
  hooks                      periodic work in the loop: hooks.Periodic
  parallelism                pmap or jit(shard_map), chosen by the config:
                             parallelism.from_config(config)
  progress                   progress.report(step), for a loop of one's own
  dropout                    dropout(rng, rate, x) with a key per example,
                             the same on any topology (runtime/randomness.py)
  per_example                per_example(forward)(rng, x): Flax's dropout
                             layers with a key per example, under
                             Task(rng='example')
  fingerprint                fingerprint(tree), to compare processes
  Weighted                   a loss or metric as (total, weight), summed
                             over the whole step before dividing: an LM's
                             token-weighted loss on any layout
                             (runtime/weighted.py)
  DynamicScale               a dynamic loss scale for float16,
                             Task(loss_scale=DynamicScale()): Flax's, step
                             for step (runtime/loss_scale.py)

Example:
  >>> import runtime
  >>> def train_and_evaluate(config, workdir):
  ...   task = runtime.Task(params=params, loss_fn=loss_fn,
  ...                       optimizer=optax.sgd(0.1),
  ...                       data=runtime.ArraySource(x=x, y=y))
  ...   return runtime.train(config, workdir, task)

The names load on first use: the supervisor imports runtime.common, the
JAX-free part, and importing this package must not load JAX for it.
"""

import functools
import importlib
from typing import Any, Callable
import warnings

from runtime.common import deprecations

__all__ = [
    'ArraySource',
    'CheckpointError',
    'ConfigError',
    'DynamicScale',
    'PodrunError',
    'Preempted',
    'Task',
    'TrainResult',
    'Weighted',
    'dropout',
    'evaluate',
    'fingerprint',
    'hooks',
    'parallelism',
    'per_example',
    'progress',
    'train',
]

# Python hides a DeprecationWarning raised outside __main__, so a workload's
# author would never see that a name of ours goes in 0.3.0:
# show ours, once per place that uses an old name.
warnings.filterwarnings('default',
                        category=DeprecationWarning,
                        message=r'(?s).*' + deprecations.ENDING)

# name -> (module, attribute); attribute None: the module itself.
_EXPORTS = {
    'ArraySource': ('runtime.data', 'ArraySource'),
    'CheckpointError':
        ('runtime.checkpoints.checkpoint_meta', 'CheckpointError'),
    'ConfigError': ('runtime.common.exit_codes', 'ConfigError'),
    'DynamicScale': ('runtime.loss_scale', 'DynamicScale'),
    'Weighted': ('runtime.weighted', 'Weighted'),
    'PodrunError': ('runtime.common.exit_codes', 'PodrunError'),
    'Preempted': ('runtime.preemption', 'Preempted'),
    'Task': ('runtime.task', 'Task'),
    'TrainResult': ('runtime.task', 'TrainResult'),
    'dropout': ('runtime.randomness', 'dropout'),
    'evaluate': ('runtime.evaluation', 'evaluate'),
    'fingerprint': ('runtime.fingerprint', None),
    'hooks': ('runtime.hooks', None),
    'parallelism': ('runtime.parallelism', None),
    'per_example': ('runtime.randomness', 'per_example'),
    'progress': ('runtime.progress', None),
    'train': ('runtime.training', 'train'),
}

# `runtime.train` and `runtime.evaluate` were modules until the functions took
# their names; `train.Task` and `evaluate.evaluate` keep working one release.
_WERE_MODULES = ('evaluate', 'train')


class _FunctionThatWasAModule:
  """Calls the function; reading any other name off it warns and reads it
  from the module that replaced the old one."""

  def __init__(self, fn: Callable, name: str, module_name: str):
    functools.update_wrapper(self, fn)
    self._old, self._module_name = name, module_name

  def __call__(self, *args, **kwargs):
    return self.__wrapped__(*args, **kwargs)

  def __repr__(self) -> str:
    return f'<function runtime.{self._old}>'

  def __getattr__(self, attribute: str) -> Any:
    if attribute.startswith('__'):
      raise AttributeError(attribute)
    value = getattr(importlib.import_module(self._module_name), attribute)
    deprecations.warn('runtime.MODULE.NAME',
                      old=self._old,
                      attribute=attribute,
                      module=self._module_name)
    return value


def __getattr__(name: str) -> Any:
  if name not in _EXPORTS:
    raise AttributeError(f'module runtime has no attribute {name!r}')
  module_name, attribute = _EXPORTS[name]
  module = importlib.import_module(module_name)
  value: Any = module if attribute is None else getattr(module, attribute)
  if name in _WERE_MODULES:
    value = _FunctionThatWasAModule(value, name, module_name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(__all__))
