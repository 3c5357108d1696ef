"""pmap with the device-aligned leading axis checked before XLA sees it.

Handing pmap an array whose leading dim is not the local device count fails
deep inside XLA (for ten million rows: "compiling computation that requires
10000000 logical devices, but only 8 XLA devices are available"). `device_map`
checks the mapped arguments first and says how to reshape them.
"""

import functools
from typing import Any, Callable, Sequence, Union

import jax
import numpy as np

from runtime.common import exit_codes
from runtime.parallelism import mapping


class DeviceAxisError(exit_codes.ConfigError):
  """A mapped argument's leading axis is not one entry per local device."""


def _mapped_axes(in_axes: Union[int, None, Sequence[Any]], num_args: int):
  if in_axes is None or isinstance(in_axes, int):
    return [in_axes] * num_args
  return list(in_axes)


def check_device_axis(args: Sequence[Any], in_axes,
                      local_device_count: int) -> None:
  """Raises DeviceAxisError unless every mapped leaf's leading axis is D."""
  for i, (arg, axis) in enumerate(zip(args, _mapped_axes(in_axes, len(args)))):
    if axis is None:
      continue
    for path, leaf in jax.tree_util.tree_leaves_with_path(arg):
      shape = np.shape(leaf)
      if shape and shape[axis] == local_device_count:
        continue
      n = shape[axis] if shape else None
      hint = ''
      if n and n % local_device_count == 0:
        shaped = (local_device_count, n // local_device_count) + shape[1:]
        hint = (f' Reshape it to {shaped} first, for example with '
                'runtime.parallelism.split_for_devices.')
      elif n:
        hint = (f' {n} does not divide by {local_device_count}: choose a '
                f'multiple of {local_device_count}, then reshape to '
                f'({local_device_count}, n // {local_device_count}, ...).')
      raise DeviceAxisError(
          f'argument {i}{jax.tree_util.keystr(path)} has shape {shape}, but '
          'pmap maps its leading axis onto devices, one entry per device, so '
          f'that axis must have size {local_device_count} (the local device '
          f'count), not {n}.{hint}')


def device_map(fn: Callable,
               axis_name: str = mapping.DATA_AXIS,
               in_axes=0,
               **pmap_kwargs) -> Callable:
  """`jax.pmap(fn)` that explains a misaligned leading axis.

  Args:
    fn: the per-device function.
    axis_name: the pmap axis name, for collectives inside fn.
    in_axes: as for pmap: 0 or None per argument.
    **pmap_kwargs: passed to jax.pmap.

  Returns:
    A function taking arrays of shape (local_devices, ...) for mapped
    arguments.

  Example:
    >>> dots = device_map(jax.vmap(jnp.dot))(
    ...     split_for_devices(v1s, 8), split_for_devices(v2s, 8))
  """
  mapped = jax.pmap(fn, axis_name=axis_name, in_axes=in_axes, **pmap_kwargs)

  @functools.wraps(fn)
  def call(*args):
    check_device_axis(args, in_axes, jax.local_device_count())
    return mapped(*args)

  return call
