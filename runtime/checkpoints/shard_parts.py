"""Each process's part of a sharded state: what it holds, and putting the
parts back together.

With `config.state_layout='sharded'` a process's devices hold a block of
each leaf (runtime/parallelism/state_layout.py): the whole leaf when a
replica is one process, a slice of it when a replica spans processes
('all', 'slice'). The local tier keeps only that block, so no host ever
holds the whole state. A process's *position* is its place among its
replica's processes; the processes at one position in every replica hold
the same blocks, so a process that lost its copy gets its blocks from the
same position in another replica.

- `positions(grid)`: {process index: Position} on the (replicas, shards)
  mesh; `record(shardings, process)`, what a local copy of its part says.
- `own(state)`: this process's block of each leaf of a placed state, as
  numpy.
- `place(part, shardings, like)`: the global state from every process's
  own part (each holds its own).
- `assemble(part, shardings, like, sources)`: the global state when only
  some processes hold their part: each position's blocks come from the
  replica of its source process, selected on the devices (exact: no
  arithmetic touches the bits).

Example:
  >>> part = own(run.state)                  # blocks, numpy
  >>> state = place(part, shardings, like)   # every process held its own
"""

import dataclasses
import hashlib
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np

from runtime.parallelism import state_layout


@dataclasses.dataclass(frozen=True)
class Position:
  """Where one process sits on the (replicas, shards) mesh.

  Attributes:
    replica: the replica it belongs to, 0 to replicas - 1.
    index: its place among that replica's processes.
    replicas: how many replicas the job has.
    processes: processes per replica.
  """
  replica: int
  index: int
  replicas: int
  processes: int

  def describe(self) -> dict[str, int]:
    """What a local copy records, to be offered only where it fits."""
    return {
        'position': self.index,
        'processes_per_replica': self.processes,
        'replicas': self.replicas
    }


def positions(grid) -> dict[int, Position]:
  """{process index: Position} of every process of `grid`, a
  (replicas, shards) mesh whose rows list each replica's devices in the
  batch's order."""
  rows = np.asarray(grid.devices)
  out = {}
  for replica, row in enumerate(rows):
    processes = list(dict.fromkeys(d.process_index for d in row))
    for index, process in enumerate(processes):
      out[process] = Position(replica, index, len(rows), len(processes))
  return out


def record(shardings: Any, process_index: int) -> dict[str, Any]:
  """What a local copy of this process's part records, so that it is
  offered only to a process that would hold the same blocks: its position
  and how each leaf is split."""
  placements = jax.tree_util.tree_leaves(shardings)
  split = hashlib.sha256(repr([tuple(p.spec) for p in placements]).encode())
  return {
      **positions(placements[0].mesh)[process_index].describe(), 'split':
          split.hexdigest()[:16]
  }


def fits(recorded: Optional[dict[str, Any]], mine: dict[str, Any]) -> bool:
  """Whether a local copy that recorded `recorded` (its `record`) holds the
  blocks this process would hold (`mine`): the same position in a replica
  of as many processes, the leaves split alike. The number of replicas is
  left out: a replica lost or back leaves every other replica's blocks
  where they were."""
  if not recorded:
    return False
  keys = set(recorded) | set(mine)
  return all(recorded.get(k) == mine.get(k) for k in keys - {'replicas'})


def _box(sharding, shape: tuple[int, ...]) -> tuple[slice, ...]:
  """The block of a leaf of `shape` that this process's devices hold."""
  starts, stops = [None] * len(shape), [None] * len(shape)
  for index in sharding.addressable_devices_indices_map(shape).values():
    for dim, (part, size) in enumerate(zip(index, shape)):
      start, stop, _ = part.indices(size)
      starts[dim] = start if starts[dim] is None else min(starts[dim], start)
      stops[dim] = stop if stops[dim] is None else max(stops[dim], stop)
  return tuple(slice(a, b) for a, b in zip(starts, stops))


def _within(index: tuple[slice, ...], box: tuple[slice, ...],
            shape: tuple[int, ...]) -> tuple[slice, ...]:
  """`index` of a leaf of `shape` as an index into the block `box`."""
  out = []
  for part, outer, size in zip(index, box, shape):
    start, stop, _ = part.indices(size)
    out.append(slice(start - outer.start, stop - outer.start))
  return tuple(out)


def own(state: Any) -> Any:
  """This process's block of each leaf of `state` (global arrays), as numpy
  arrays: what its devices hold, each element once."""

  def block(x):
    box = _box(x.sharding, x.shape)
    out = np.empty(tuple(s.stop - s.start for s in box), x.dtype)
    for shard in x.addressable_shards:
      out[_within(shard.index, box, x.shape)] = np.asarray(shard.data)
    return out

  return jax.tree_util.tree_map(block, state)


def like_own(like: Any, shardings: Any) -> Any:
  """Zeros shaped as this process's blocks of `like`'s leaves placed by
  `shardings`: the tree, shapes and dtypes a local copy is read into."""
  return jax.tree_util.tree_map(
      lambda x, sharding: np.zeros(
          tuple(s.stop - s.start
                for s in _box(sharding, np.shape(x))), np.result_type(x)), like,
      shardings)


def place(part: Any, shardings: Any, like: Any) -> Any:
  """Global arrays placed by `shardings` from this process's blocks
  (`own`); every process calls it with its own."""

  def one(block, sharding, x):
    shape = np.shape(x)
    box = _box(sharding, shape)
    return jax.make_array_from_callback(
        shape, sharding, lambda index: block[_within(index, box, shape)])

  return jax.tree_util.tree_map(one, part, shardings, like)


def assemble(part: Optional[Any], shardings: Any, like: Any,
             sources: dict[int, int]) -> Any:
  """Global arrays placed by `shardings` when only some processes hold
  their blocks; every process calls it at once.

  Each replica first puts what it holds into a pool, a leading axis of one
  row per replica (zeros where its process holds nothing); each element of
  the result is then selected from the row of the replica whose process
  `sources` names for that element's position.

  Args:
    part: this process's blocks (`own`, read back), or None.
    shardings: the state's NamedShardings on one (replicas, shards) mesh.
    like: the state's tree, shapes and dtypes (host arrays or shapes).
    sources: {position: the process that holds that position's blocks};
      every position of a replica.
  """
  placements, treedef = jax.tree_util.tree_flatten(shardings)
  grid = placements[0].mesh
  where = positions(grid)
  shards = grid.shape[state_layout.SHARD_AXIS]
  per_process = shards // where[0].processes
  # The replica to take each shard from, by the shard's position.
  take = tuple(
      where[sources[shard // per_process]].replica for shard in range(shards))
  leaves = jax.tree_util.tree_leaves(like)
  blocks = (jax.tree_util.tree_leaves(part) if part is not None else [None] *
            len(leaves))
  pools = [
      _pool(block, sharding, np.shape(x), np.result_type(x))
      for block, sharding, x in zip(blocks, placements, leaves, strict=True)
  ]
  specs = tuple(p.spec for p in placements)
  chosen = _select(grid, treedef, specs, take)(pools)
  return chosen


def _pool(block: Optional[np.ndarray], sharding, shape, dtype) -> jax.Array:
  """(replicas, *shape): row r on replica r's devices, from this process's
  block, or zeros."""
  spec = PartitionSpec(state_layout.REPLICA_AXIS, *sharding.spec)
  pool_sharding = NamedSharding(sharding.mesh, spec)
  box = _box(sharding, shape)

  def fill(index):
    inner = index[1:]
    size = tuple(len(range(*s.indices(n))) for s, n in zip(inner, shape))
    if block is None:
      return np.zeros((1,) + size, dtype)
    return block[_within(inner, box, shape)][None]

  rows = sharding.mesh.shape[state_layout.REPLICA_AXIS]
  return jax.make_array_from_callback((rows,) + tuple(shape), pool_sharding,
                                      fill)


_SELECTS: dict = {}
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _as_bits(x: jax.Array) -> jax.Array:
  """`x`'s bits as unsigned integers of its width (bool as uint8)."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint8)
  return jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])


def _from_bits(bits: jax.Array, dtype) -> jax.Array:
  if dtype == jnp.bool_:
    return bits.astype(jnp.bool_)
  return jax.lax.bitcast_convert_type(bits, dtype)


def _select(grid, treedef, specs: tuple, take: tuple[int, ...]):
  """The jitted selection from the pools, compiled once per layout."""
  key = (grid, treedef, specs, take)
  if key not in _SELECTS:
    shards = len(take)
    outs = tuple(NamedSharding(grid, s) for s in specs)

    def one(pool, spec):
      # XLA takes a row of a pool split over replicas as a sum, over the
      # replicas, of that row and zeros: on the bits, as unsigned integers,
      # the sum keeps every one (-0.0 and NaN payloads too).
      bits = _as_bits(pool)
      split = [
          d for d, axis in enumerate(tuple(spec))
          if axis == state_layout.SHARD_AXIS
      ]
      out = bits[take[0]]
      if split:
        dim = split[0]
        size = pool.shape[1 + dim]
        # The replica each element along the split dimension comes from.
        rows = np.repeat(np.asarray(take), size // shards)
        shape = [1] * (pool.ndim - 1)
        shape[dim] = size
        for replica in sorted(set(take) - {take[0]}):
          mask = jnp.asarray((rows == replica).reshape(shape))
          out = jnp.where(mask, bits[replica], out)
      return _from_bits(out, pool.dtype)

    _SELECTS[key] = jax.jit(lambda pools: jax.tree_util.tree_unflatten(
        treedef, [one(p, s) for p, s in zip(pools, specs)]),
                            out_shardings=jax.tree_util.tree_unflatten(
                                treedef, list(outs)))
  return _SELECTS[key]
