"""Finding the function a config names as its workload."""

import importlib
import os
import sys
from typing import Any, Callable

from ml_collections import ConfigDict

from runtime.common import exit_codes

# The config, a flag or the workload it names is unusable (exit 2).
ConfigError = exit_codes.ConfigError


def parse(spec: Any) -> tuple[str, str]:
  """'package.module:function' -> ('package.module', 'function').

  Raises:
    ConfigError: when the spec is missing or malformed.
  """
  if not spec:
    raise ConfigError('the config names no workload: set config.workload to '
                      '"package.module:function" (the function is called as '
                      'function(config, workdir)).')
  module, sep, function = str(spec).partition(':')
  if not sep or not module or not function.isidentifier():
    raise ConfigError(
        f'config.workload={spec!r} is not "package.module:function", for '
        'example "runtime.workloads.linear_regression:train_and_evaluate".')
  return module, function


def resolve(spec: Any) -> Callable[[ConfigDict, str], Any]:
  """Imports the workload function; the current directory is importable.

  Call it only after jax.distributed is initialised: importing a workload
  may run JAX code. The function, called as function(config, workdir),
  returns a runtime.TrainResult, or a dict of its own results for
  summary.json.

  Example:
    >>> fn = resolve('runtime.workloads.linear_regression:train_and_evaluate')
  """
  module_name, function_name = parse(spec)
  if os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ConfigError(
        f'cannot import the workload module {module_name!r} of '
        f'config.workload={spec!r}: {type(e).__name__}: {e}. Importable are '
        f'the installed packages and the current directory, {os.getcwd()}: '
        'run from the directory that holds the module (scripts/run.sh runs '
        'from the repository\'s; for a project of your own use podrun from '
        'its directory).') from e
  function = getattr(module, function_name, None)
  if not callable(function):
    raise ConfigError(f'module {module_name!r} has no function '
                      f'{function_name!r} (config.workload={spec!r})')
  return function
