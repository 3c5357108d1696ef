"""Splitting a global batch among processes, then among each process's devices.

The global batch of G examples is cut into `process_count` contiguous runs of
rows; process p keeps run p, its rows, and reshapes them to
(local_device_count, G / D, ...), the leading axis that pmap maps onto its
local devices (D is the global device count). Across processes the rows are
disjoint and together are exactly the global batch.
"""

from typing import Any

import jax
import numpy as np

from runtime.common import deprecations
from runtime.common import exit_codes


class BatchSizeError(exit_codes.ConfigError):
  """A batch does not divide evenly over the processes or devices."""


def _nearby_multiples(n: int, k: int) -> str:
  below, above = (n // k) * k, (n // k + 1) * k
  return f'{below} or {above}' if below > 0 else f'{above}'


def per_device_batch_size(global_batch_size: int, process_count: int,
                          local_device_count: int) -> int:
  """Returns G / (process_count * local_device_count), or says what would fit.

  Args:
    global_batch_size: examples per step over the whole job.
    process_count: processes in the job.
    local_device_count: devices per process.

  Raises:
    BatchSizeError: naming all three numbers and the nearest sizes that work.

  Example:
    >>> per_device_batch_size(256, 2, 4)
    32
  """
  device_count = process_count * local_device_count
  if global_batch_size <= 0 or global_batch_size % device_count:
    raise BatchSizeError(
        f'global batch size {global_batch_size} does not divide evenly over '
        f'{process_count} processes x {local_device_count} local devices = '
        f'{device_count} devices; use a multiple of {device_count}, such as '
        f'{_nearby_multiples(global_batch_size, device_count)} '
        '(config.global_batch_size).')
  return global_batch_size // device_count


def process_rows(global_batch_size: int, process_index: int,
                 process_count: int) -> slice:
  """The rows of a global batch that one process owns, contiguous, as a
  Python `slice`.

  Example:
    >>> process_rows(256, 1, 2)
    slice(128, 256, None)
  """
  if global_batch_size % process_count:
    raise BatchSizeError(
        f'global batch size {global_batch_size} does not divide over '
        f'{process_count} processes; use a multiple of {process_count}, such '
        f'as {_nearby_multiples(global_batch_size, process_count)}.')
  if not 0 <= process_index < process_count:
    raise ValueError(f'process index {process_index} is outside '
                     f'[0, {process_count})')
  size = global_batch_size // process_count
  return slice(process_index * size, (process_index + 1) * size)


def process_slice(global_batch_size: int, process_index: int,
                  process_count: int) -> slice:
  """Deprecated: the old name of `process_rows`, kept for one release."""
  deprecations.warn('parallelism.process_slice')
  return process_rows(global_batch_size, process_index, process_count)


def split_for_devices(tree: Any,
                      local_device_count: int,
                      what: str = 'batch') -> Any:
  """Reshapes every leaf from (n, ...) to (local_device_count, n / D, ...).

  Args:
    tree: a pytree of arrays sharing the leading dim n.
    local_device_count: D, the size of pmap's device axis in this process.
    what: how to call the tree in an error message.

  Returns:
    The same tree, every leaf with a leading device axis of size D.

  Raises:
    BatchSizeError: when n does not divide by D, explaining the device-aligned
      leading axis that pmap needs.
  """

  def split(path, x):
    n = x.shape[0] if np.ndim(x) else None
    if n is None or n % local_device_count:
      name = f'{what}{jax.tree_util.keystr(path)}'
      shape = np.shape(x)
      raise BatchSizeError(
          f'{name} has shape {shape}: its leading dim '
          f'{n} does not split evenly over {local_device_count} local devices. '
          'pmap maps the leading axis onto devices one entry each, so the data'
          f' must be reshaped to ({local_device_count}, n // '
          f'{local_device_count}, ...) with n a multiple of '
          f'{local_device_count}' +
          (f', such as {_nearby_multiples(n, local_device_count)}.'
           if n else '.'))
    return x.reshape((local_device_count, n // local_device_count) +
                     x.shape[1:])

  return jax.tree_util.tree_map_with_path(split, tree)


def merge_devices(tree: Any) -> Any:
  """Inverse of `split_for_devices`: (D, n / D, ...) -> (n, ...)."""
  return jax.tree_util.tree_map(
      lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]), tree)
