"""pmap or jit(shard_map): one object, chosen once, that runs a per-device
function over the axis `devices`.

`from_placement(placement)` turns the parallelism a config names
(runtime/parallelism/options.py) into a `Parallelism`;
everything else in the runtime calls its four methods, so a step written once
runs both ways:

- `PMAP` (the default): `jax.pmap` over the axis `devices`. Replicated
  arguments are host-local arrays on this process's devices; mapped ones carry
  a leading local-device axis, (local_devices, n / local_devices, ...).
- `SHARD_MAP`: `jax.jit` of `jax.shard_map` over a one-dimensional mesh, axis
  `devices`, of every device of every process. Replicated arguments are global
  arrays with `PartitionSpec()` and no device axis; mapped ones are global
  arrays of the whole global batch, (global_batch, ...), split along dim 0,
  assembled from each process's local rows.

Inside, the per-device function sees the same shapes either way: replicated
arguments whole, mapped ones as (per_device_batch, ...), and `lax.pmean` /
`lax.psum` over `devices` span all devices of all processes.
"""

import functools
from typing import Any, Callable, Optional, Sequence

import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from ml_collections import ConfigDict
import numpy as np

from runtime.common import deprecations
from runtime.parallelism import batches
from runtime.parallelism import options

# The mesh / pmap axis that spans every device of every process.
DATA_AXIS = options.DATA_AXIS


@functools.lru_cache(maxsize=None)
def global_mesh(axis: str = DATA_AXIS) -> Mesh:
  """A 1-D mesh, axis `axis`, of all devices, each process's together.

  Devices are ordered by (process index, id), so process p's devices hold
  rows [p * G / P, (p + 1) * G / P) of a global batch: the rows that
  `batches.process_rows` gives it.
  """
  devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
  return Mesh(np.array(devices), (axis,))


def _local_mesh(axis: str) -> Mesh:
  return Mesh(np.array(jax.local_devices()), (axis,))


def _spec(position: Optional[int], axis: str) -> PartitionSpec:
  if position not in (None, 0):
    raise ValueError(f'in/out axis {position}: only 0 (mapped over devices) '
                     'and None (replicated) are supported')
  return PartitionSpec() if position is None else PartitionSpec(axis)


def _read(x: Any) -> np.ndarray:
  """One array's whole value on this host (see `Parallelism.to_host`)."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  if x.is_fully_replicated:
    return np.asarray(x.addressable_data(0))
  parts: dict[tuple, Any] = {}
  for shard in x.addressable_shards:
    key = tuple((i.start, i.stop) for i in shard.index)
    parts.setdefault(key, shard)
  if sum(s.data.size for s in parts.values()) == x.size:
    whole = np.empty(x.shape, x.dtype)
    for shard in parts.values():
      whole[shard.index] = np.asarray(shard.data)
    return whole
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


class Parallelism:
  """How the job's devices run one per-device function, and the name of the
  axis its collectives use (config.axis_name; DATA_AXIS unless set).
  Compare and hash by both.

  Example:
    >>> par = parallelism.from_config(config)
    >>> step = par.map(step_fn, in_axes=(None, 0), out_axes=(None, None))
    >>> state, metrics = step(par.replicate(state), par.put_batch(batch))
    >>> par.to_host(metrics)
  """
  name = ''

  def __init__(self, axis: str = DATA_AXIS):
    self.axis = axis

  def with_axis(self, axis: str) -> 'Parallelism':
    """The same way to run, with collectives over `axis` (itself when the
    name is its own: PMAP and SHARD_MAP stay the values they are)."""
    return self if axis == self.axis else type(self)(axis)

  def map(self,
          fn: Callable,
          in_axes: Sequence[Optional[int]],
          out_axes: Any,
          donate_argnums: tuple[int, ...] = ()) -> Callable:
    """Runs `fn` once per device of the job, collectives over `self.axis`.

    Args:
      fn: the per-device function.
      in_axes: per positional argument, 0 (mapped: split over devices) or
        None (replicated).
      out_axes: 0 or None, or a pytree prefix of the outputs of them.
      donate_argnums: arguments whose buffers the call may reuse.

    Returns:
      The mapped function; feed it `put_batch` and `replicate` placements.
    """
    raise NotImplementedError

  def put_batch(self, tree: Any) -> Any:
    """Places this process's rows of a mapped argument on the devices.

    Args:
      tree: pytree of numpy arrays, each (n, ...) with n this process's share
        of the global batch, the same n on every process.

    Returns:
      pmap: leaves (local_devices, n / local_devices, ...) on the local
      devices. shard_map: global (n * process_count, ...) arrays split over
      the global mesh.

    Raises:
      BatchSizeError: when n does not split over the local devices.
    """
    raise NotImplementedError

  def replicate(self, tree: Any) -> Any:
    """Places a pytree of host values, whole, on every device it spans."""
    raise NotImplementedError

  def to_host(self, tree: Any) -> Any:
    """Numpy copies of replicated, fully addressable or sharded arrays.

    A replicated global array spans devices of other processes, so it is read
    from one of this process's copies; a sharded one (a sharded state's
    leaf) from this process's parts when they cover it (a replica per
    process), else gathered from every process: then every process must ask
    at once, as the saves and the hooks do.
    """
    return jax.tree_util.tree_map(_read, tree)

  def __repr__(self) -> str:
    if self.axis == DATA_AXIS:
      return self.name
    return f'{self.name} over the axis {self.axis!r}'

  def __eq__(self, other) -> bool:
    return (isinstance(other, Parallelism) and other.name == self.name and
            other.axis == self.axis)

  def __hash__(self) -> int:
    return hash((self.name, self.axis))


class _Pmap(Parallelism):
  """`jax.pmap`: host-local arrays with a leading local-device axis."""
  name = 'pmap'

  def map(self, fn, in_axes, out_axes, donate_argnums=()):
    return jax.pmap(fn,
                    axis_name=self.axis,
                    in_axes=tuple(in_axes),
                    out_axes=out_axes,
                    donate_argnums=donate_argnums)

  def put_batch(self, tree):
    local = batches.split_for_devices(tree, jax.local_device_count())
    return jax.device_put(
        local, NamedSharding(_local_mesh(self.axis), PartitionSpec(self.axis)))

  def replicate(self, tree):
    # The layout pmap's out_axes=None gives back: no recompile after step 1.
    return jax.device_put(
        tree, NamedSharding(_local_mesh(self.axis), PartitionSpec()))


class _ShardMap(Parallelism):
  """`jax.jit(jax.shard_map)` over the global mesh: global arrays."""
  name = 'shard_map'

  def map(self, fn, in_axes, out_axes, donate_argnums=()):
    out_specs = jax.tree_util.tree_map(lambda p: _spec(p, self.axis),
                                       out_axes,
                                       is_leaf=lambda x: x is None)
    # check_vma=False gives pmap's semantics, which the step is written for.
    # With the check on, JAX tracks that the parameters are replicated, so the
    # gradient with respect to them comes out already summed over the
    # devices, and the step's own pmean would leave it device_count too big.
    mapped = jax.shard_map(fn,
                           mesh=global_mesh(self.axis),
                           in_specs=tuple(_spec(a, self.axis) for a in in_axes),
                           out_specs=out_specs,
                           check_vma=False)
    return jax.jit(mapped, donate_argnums=donate_argnums)

  def put_batch(self, tree):
    # Split first anyway: the same divisibility check and message as pmap.
    local = batches.split_for_devices(tree, jax.local_device_count())
    placement = NamedSharding(global_mesh(self.axis), PartitionSpec(self.axis))

    def assemble(x):
      rows = batches.merge_devices(x)
      global_shape = (rows.shape[0] * jax.process_count(),) + rows.shape[1:]
      return jax.make_array_from_process_local_data(placement, rows,
                                                    global_shape)

    return jax.tree_util.tree_map(assemble, local)

  def replicate(self, tree):
    placement = NamedSharding(global_mesh(self.axis), PartitionSpec())
    return jax.tree_util.tree_map(
        lambda x: jax.make_array_from_process_local_data(
            placement, np.asarray(x)), tree)


PMAP = _Pmap()
SHARD_MAP = _ShardMap()
CHOICES = (PMAP, SHARD_MAP)


def named(name: str) -> Parallelism:
  """The Parallelism called `name`, or an error that lists the choices."""
  for choice in CHOICES:
    if choice.name == name:
      return choice
  raise ValueError(f'config.parallelism={name!r}; choose one of '
                   f'{", ".join(repr(c.name) for c in CHOICES)}')


def from_placement(placement: options.Placement) -> Parallelism:
  """The Parallelism `placement` names, over its batch axis."""
  return named(placement.parallelism).with_axis(placement.axis_name)


def from_config(config: ConfigDict) -> Parallelism:
  """The Parallelism that config.parallelism names ('pmap' or 'shard_map';
  '' chooses: options.Placement), over config.axis_name.

  Example:
    >>> par = parallelism.from_config(config)
  """
  return from_placement(options.Placement.of(config))


def of(config: ConfigDict) -> Parallelism:
  """Deprecated: the old name of `from_config`, kept for one release."""
  deprecations.warn('parallelism.of')
  return from_config(config)
