"""An in-memory data set kept on the devices (config.data.on_device).

A small step on an accelerator leaves the host as the bound: each call's
batch is read from host memory and copied to the devices, megabytes a call.
With the data set on every device (replicated once, at the start), a call
sends only its example ids, and one compiled gather builds the batch where
the step reads it. The ids are those the host path reads, in the same
order (runtime/training.py `_loader`), so the batches are the same; a
layout's padding rows are ids past the data set's end, which the gather
fills with zeros, as the host path pads.

Example:
  >>> gather = Gather(par, source)              # source: a runtime.ArraySource
  >>> batch = gather(order)                     # (n,) ids, the host's order
"""

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from runtime.common import exit_codes
from runtime import data as data_lib


class DeviceDataError(exit_codes.ConfigError):
  """config.data.on_device=True for data that cannot go to the devices."""


def check(source: Any) -> None:
  """Refuses a source that is not arrays in memory.

  Raises:
    DeviceDataError: naming the source's type and what to use.
  """
  if not isinstance(source, data_lib.ArraySource):
    raise DeviceDataError(
        f'config.data.on_device=True keeps the data set on the devices, '
        f'which needs its arrays in memory as a runtime.ArraySource; this '
        f'task\'s data is a {type(source).__name__}. Wrap the arrays in '
        'runtime.ArraySource(name=array, ...), or set config.data.on_device='
        'False.')


# The share of a device's memory the data set may take.
MOST_SHARE = 0.5
# The share it takes when config.data.on_device is left to choose: the rest
# is the state's, the step's and the prefetched batches'.
AUTO_SHARE = 0.25


def choose(source: Any, platform: str,
           stats: Optional[dict]) -> tuple[bool, str]:
  """config.data.on_device left unset (None): whether to keep the data set
  on the devices, and why, for the run's line. On an accelerator, an
  in-memory source (a runtime.ArraySource) within AUTO_SHARE of a device's
  memory goes there: each call then sends only its ids (on a TPU v5e the
  MNIST MLP ran 3.1x as many examples a second so, BUILD_NOTES.md, issue
  71). On a CPU the devices are host memory: a gather there is a host copy
  too, so the batches come from the host."""
  if platform == 'cpu':
    return False, 'auto: a CPU\'s devices are host memory'
  if not isinstance(source, data_lib.ArraySource):
    return False, f'auto: a {type(source).__name__} is read from the host'
  size = sum(a.nbytes for a in source.arrays.values())
  limit = (stats or {}).get('bytes_limit')
  if not limit or size > AUTO_SHARE * limit:
    return False, (f'auto: the data set\'s {size / 2**30:.2f} GiB is over '
                   f'{AUTO_SHARE:.0%} of a device\'s memory'
                   if limit else 'auto: the device does not say its memory')
  return True, (f'auto: the data set\'s {size / 2**20:.0f} MiB is within '
                f'{AUTO_SHARE:.0%} of a device\'s memory')


def check_fits(size: int, stats: Optional[dict]) -> None:
  """Refuses a data set of `size` bytes over MOST_SHARE of a device's
  memory (`stats`: its memory_stats(); None or no limit, as on a CPU: any
  size).

  Raises:
    DeviceDataError: naming both sizes and what to set.
  """
  limit = (stats or {}).get('bytes_limit')
  if limit and size > MOST_SHARE * limit:
    raise DeviceDataError(
        f'config.data.on_device=True: the data set is {size / 2**30:.2f} GiB '
        f'and a device has {limit / 2**30:.2f} GiB, of which it may take '
        f'{MOST_SHARE:.0%} beside the state and the step; set '
        'config.data.on_device=False to read each batch from the host.')


def _take(arrays: dict[str, jax.Array], ids: jax.Array) -> dict[str, jax.Array]:
  # An id past the end (a padding row) reads zeros.
  return {
      name: jnp.take(a, ids, axis=0, mode='fill', fill_value=0)
      for name, a in arrays.items()
  }


class Gather:
  """The data set on every device, and the gather of a call's batch.

  Args:
    par: how the step maps over the devices (runtime/parallelism).
    source: the task's runtime.ArraySource; its arrays are placed whole on
      every device the step spans.
  """

  def __init__(self, par, source: data_lib.ArraySource):
    check(source)
    check_fits(sum(a.nbytes for a in source.arrays.values()),
               jax.local_devices()[0].memory_stats())
    self._par = par
    self.padding_id = len(source)
    self._arrays = par.replicate(source.arrays)
    self._gather: Optional[Callable[..., Any]] = None

  def __call__(self, order: np.ndarray) -> dict[str, jax.Array]:
    """The batch of the ids `order`.

    Args:
      order: (n,) ids, this process's rows of the call in the order
        `put_batch` takes them; `padding_id` for a padding row.

    Returns:
      each array's rows, placed as `par.put_batch` places a host batch.
    """
    ids = self._par.put_batch(order.astype(np.int32))
    if self._gather is None:
      # The batch keeps the ids' placement: each device gathers its rows.
      self._gather = jax.jit(_take, out_shardings=ids.sharding)
    return self._gather(self._arrays, ids)
