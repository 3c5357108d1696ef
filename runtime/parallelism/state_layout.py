"""Where the state's leaves live when split over a replica's devices.

Sharded state (config.state_layout='sharded'), its placement: the mesh of
replicas and shards, the rule that picks the dimension each leaf is split
along, and what that leaves on one device. `step.make_sharded_train_step`
trains on it, `training.train` places the state by it, and the persistent
tier saves and restores it shard by shard (checkpoints/checkpoint.py).

- `mesh(replica)`: a 2-D mesh, axes (`REPLICA_AXIS`, `SHARD_AXIS`). A
  replica is one process ('process': CPU and GPU hosts), one slice ('slice':
  TPU multislice) or every device ('all': plain FSDP). Flattened row-major,
  its devices are in `mapping.global_mesh()`'s order, so every device still
  trains on the rows of the global batch it trains on today.
- `shard_dim(shape, shards)`: the largest dimension that `shards` divides
  (the first of equals), None when none does: that leaf stays whole.
- `specs(tree, shards, overrides)`: a PartitionSpec per leaf; a user's
  override (`config.shard_dims`, `Task.shard_dims`) names a leaf by its
  path ('params/dense/kernel'), or by the path's end ('dense/kernel', which
  names the optimiser's moments of it too), shell-style patterns allowed,
  and gives its dimension, or None for whole.
- `parse_dims(text)`: config.shard_dims's 'PATTERN=DIM,...' as overrides.
- `footprint(tree, specs, shards)`: the bytes one device holds, split and
  whole, and the leaves that do not divide.

Example:
  >>> layout = state_layout.specs(state, shards=8)
  >>> print(state_layout.footprint(state, layout, shards=8).describe())
  state per device 12.4 MiB: 12.0 MiB of it split 8 ways, 0.4 MiB whole
  (3 leaves kept whole, that 8 does not divide or an override keeps:
  ...); 96.0 MiB whole on every device
"""

import dataclasses
import fnmatch
from typing import Any, Callable, Mapping, Optional

import jax
from jax.sharding import Mesh, PartitionSpec
import numpy as np

from runtime.common import elastic_replicas
from runtime.common import exit_codes
from runtime.parallelism import mapping
from runtime.parallelism import options

REPLICA_AXIS = 'replicas'
SHARD_AXIS = 'shards'
REPLICAS = ('process', 'slice', 'all')

LAYOUTS = ('replicated', 'sharded')


def replica_of(placement: options.Placement,
               elastic: Optional[tuple[int, int]] = None,
               elastic_slices: bool = False) -> Optional[str]:
  """The replica ('process', 'slice' or 'all') when `placement` shards the
  state, else None.

  Args:
    placement: what the config says of the parallelism and the state.
    elastic: the elastic job's (fewest, most) processes, or None for a
      fixed size.
    elastic_slices: the elastic job loses and regains whole slices (the TPU
      driver's --min_slices), so a replica of a slice is lost whole too.

  Raises:
    ConfigError: an unknown layout or replica, 'sharded' under pmap or in
      an elastic job, naming what to change.
  """
  chosen = placement.state_layout
  if chosen not in LAYOUTS:
    raise exit_codes.ConfigError(
        f'config.state_layout={chosen!r}; choose one of '
        f'{", ".join(repr(l) for l in LAYOUTS)}')
  if chosen == 'replicated':
    return None
  if placement.parallelism != 'shard_map':
    raise exit_codes.ConfigError(
        f"config.state_layout='sharded' with config.parallelism="
        f"{placement.parallelism!r}: pmap holds every argument whole on "
        "every device; set config.parallelism='shard_map', or leave it '' "
        'to have it chosen')
  replica = placement.replica
  if replica not in REPLICAS:
    raise exit_codes.ConfigError(f'config.replica={replica!r}; choose one of '
                                 f'{", ".join(repr(r) for r in REPLICAS)}')
  refused = elastic_replicas.refusal(chosen, replica, elastic, elastic_slices)
  if refused:
    raise exit_codes.ConfigError(refused)
  return replica


@dataclasses.dataclass(frozen=True)
class StateLayout:
  """Where a run's train state lives: replicated on every device (the
  default), or sharded over each replica's devices by `shardings` (a
  NamedSharding per leaf). The one place that tells the two kinds apart
  for the loop and its set-up.

  Attributes:
    shardings: the state's shardings; None: replicated.
    where: the console's line on where it lives ('' when replicated).
  """
  shardings: Optional[Any] = None
  where: str = ''

  @property
  def sharded(self) -> bool:
    return self.shardings is not None

  def place(self, state: Any, parallelism: Any) -> Any:
    """The host `state` on the devices: replicated by `parallelism`, or
    each process's parts of it placed by the shardings."""
    if self.shardings is None:
      return parallelism.replicate(state)
    return place(state, self.shardings)

  def batch_axis(self, parallelism: Any) -> Any:
    """The mesh axis a batch is split over: the parallelism's own when
    replicated; the replicas' and shards' together when sharded."""
    if self.shardings is None:
      return parallelism.axis
    return mapping.DATA_AXIS


REPLICATED = StateLayout()


def place(tree: Any, shardings: Any) -> Any:
  """Host arrays, the same on every process, as global arrays placed by
  `shardings` (a NamedSharding per leaf): each process puts only its own
  devices' parts. A leaf already a global array placed so (restored from
  the persistent tier) is kept as it is."""

  def one(x, sharding):
    if isinstance(x, jax.Array) and x.sharding == sharding:
      return x
    return jax.make_array_from_callback(np.shape(x), sharding,
                                        lambda index: np.asarray(x)[index])

  return jax.tree_util.tree_map(one, tree, shardings)


def mesh(replica: str, num_slices: int = 1) -> Mesh:
  """The (replicas, shards) mesh of every device of the job.

  Args:
    replica: as `replica_groups`.
    num_slices: the job's slices (topology.Topology.num_slices), for
      devices that carry no slice_index.

  Raises:
    ConfigError: as `replica_groups`.
  """
  return Mesh(
      np.array(replica_groups(replica, jax.devices(), num_slices),
               dtype=object), (REPLICA_AXIS, SHARD_AXIS))


def _slice_of(devices: list, num_slices: int) -> Optional[Callable[[Any], int]]:
  """A device's slice: its slice_index (a TPU multislice job's devices), or
  where the devices do not tell the `num_slices` slices the launcher said
  there are (MEGASCALE_NUM_SLICES; CPU devices standing in for slices in
  scripts/launch_tpu_pod.sh's emulation carry none, or all 0 once
  jax.distributed joins them), its process's, the processes numbered slice
  by slice as the TPU driver numbers them. None: no slices.
  """
  indices = {getattr(d, 'slice_index', None) for d in devices}
  if None not in indices and (len(indices) > 1 or num_slices <= 1):
    return lambda d: d.slice_index
  processes = len({d.process_index for d in devices})
  if num_slices > 1 and processes % num_slices == 0:
    per_slice = processes // num_slices
    return lambda d: d.process_index // per_slice
  return None


def replica_groups(replica: str,
                   devices: list,
                   num_slices: int = 1) -> list[list]:
  """`devices` as replicas: [[devices of replica 0], ...], each in the
  batch's order (process index, then id).

  Args:
    replica: 'process', 'slice' or 'all' (see the module docstring).
    devices: jax devices; their process_index (and slice_index, for
      'slice') say where each replica ends.
    num_slices: the job's slices, for 'slice' on devices without a
      slice_index (`_slice_of`).

  Raises:
    ConfigError: an unknown `replica`, 'slice' without slices, or replicas
      of unequal sizes, naming the sizes.
  """
  devices = sorted(devices, key=lambda d: (d.process_index, d.id))
  if replica == 'all':
    groups = [devices]
  elif replica in ('process', 'slice'):
    slice_of = _slice_of(devices, num_slices) if replica == 'slice' else None
    if replica == 'slice' and slice_of is None:
      raise exit_codes.ConfigError(
          "config.replica='slice': these devices carry no slice_index (not "
          "a TPU multislice job); use 'process' or 'all'")
    key = slice_of or (lambda d: d.process_index)
    owners = sorted({key(d) for d in devices})
    groups = [[d for d in devices if key(d) == o] for o in owners]
    # Each replica's devices must be contiguous in the batch's order.
    if [d for g in groups for d in g] != devices:
      raise exit_codes.ConfigError(
          f'config.replica={replica!r}: the {replica}s do not hold '
          'contiguous processes, so a replica would train on rows that are '
          "not its own; use 'process' or 'all'")
  else:
    raise exit_codes.ConfigError(f'config.replica={replica!r}; choose one of '
                                 f'{", ".join(repr(r) for r in REPLICAS)}')
  sizes = sorted({len(g) for g in groups})
  if len(sizes) > 1:
    raise exit_codes.ConfigError(
        f'config.replica={replica!r}: the replicas would hold '
        f'{", ".join(str(len(g)) for g in groups)} devices; sharded state '
        'needs replicas of one size')
  return groups


def shard_dim(shape: tuple[int, ...], shards: int) -> Optional[int]:
  """The dimension of `shape` to split `shards` ways: the largest that
  `shards` divides, the first of equals; None when none does."""
  if shards == 1:
    return None
  divisible = [(size, -axis)
               for axis, size in enumerate(shape)
               if size >= shards and size % shards == 0]
  return -max(divisible)[1] if divisible else None


def _path(key_path) -> str:
  """'params/dense/kernel' for the tree path of a leaf."""
  parts = []
  for key in key_path:
    for attribute in ('key', 'name', 'idx'):
      if hasattr(key, attribute):
        parts.append(str(getattr(key, attribute)))
        break
    else:
      parts.append(str(key))
  return '/'.join(parts)


def _spec(dim: Optional[int]) -> PartitionSpec:
  return (PartitionSpec() if dim is None else PartitionSpec(
      *([None] * dim), SHARD_AXIS))


def parse_dims(text: str) -> dict[str, Optional[int]]:
  """config.shard_dims, 'PATTERN=DIM,...', as `specs` takes overrides:
  DIM a dimension, or 'whole'.

  Example:
    >>> parse_dims('embed/embedding=1, out/*=whole')
    {'embed/embedding': 1, 'out/*': None}

  Raises:
    ConfigError: an entry without '=' or with another DIM, naming it.
  """
  out = {}
  for entry in filter(None, (e.strip() for e in text.split(','))):
    pattern, _, dim = (part.strip() for part in entry.partition('='))
    if not pattern or not (dim == 'whole' or dim.isdigit()):
      raise exit_codes.ConfigError(
          f'config.shard_dims entry {entry!r}: write PATTERN=DIM, DIM a '
          "dimension (0, 1, ...) or 'whole', entries joined by commas, e.g. "
          "'embed/embedding=1,out/*=whole'")
    out[pattern] = None if dim == 'whole' else int(dim)
  return out


def _matches(path: str, pattern: str) -> bool:
  """Whether `pattern` names the leaf at `path`: the whole path, or its
  end after a '/', so that 'dense/kernel' names params/dense/kernel and
  the optimiser's moments of it (opt_state/0/mu/dense/kernel)."""
  return (fnmatch.fnmatchcase(path, pattern) or
          fnmatch.fnmatchcase(path, '*/' + pattern))


def specs(tree: Any,
          shards: int,
          overrides: Optional[Mapping[str, Optional[int]]] = None) -> Any:
  """A PartitionSpec per leaf of `tree` (arrays, or anything with .shape).

  Args:
    tree: the state, or its shapes (jax.ShapeDtypeStruct).
    shards: devices per replica.
    overrides: {path pattern: dimension, or None for whole}; the first
      pattern that names a leaf (`_matches`) wins over the rule.

  Raises:
    ConfigError: an override's dimension that the leaf lacks or that
      `shards` does not divide, naming the leaf, its shape and `shards`;
      a pattern that names no leaf, naming some that exist.
  """
  overrides = dict(overrides or {})
  used = set()

  def one(key_path, leaf):
    shape = tuple(np.shape(leaf))
    path = _path(key_path)
    for pattern, dim in overrides.items():
      if _matches(path, pattern):
        used.add(pattern)
        if dim is not None and (dim >= len(shape) or shape[dim] % shards):
          raise exit_codes.ConfigError(
              f'state layout override {pattern!r}: {path} has shape '
              f'{shape}, whose dimension {dim} ' +
              ('does not exist' if dim >= len(shape) else
               f'({shape[dim]}) {shards} shards do not divide') +
              '; give another dimension, or None to keep it whole')
        return _spec(dim)
    return _spec(shard_dim(shape, shards))

  out = jax.tree_util.tree_map_with_path(one, tree)
  unused = [p for p in overrides if p not in used]
  if unused:
    paths = [_path(k) for k, _ in jax.tree_util.tree_leaves_with_path(tree)]
    shown = [p for p in paths if p.startswith('params/')][:6] or paths[:6]
    raise exit_codes.ConfigError(
        f'state layout override(s) {", ".join(repr(p) for p in unused)} '
        f'name no leaf of the state; leaves are named like '
        f'{", ".join(shown)} (a pattern names a whole path, or its end '
        "after a '/', shell-style wildcards allowed)")
  return out


@dataclasses.dataclass(frozen=True)
class Footprint:
  """The state's bytes on one device.

  Attributes:
    shards: devices per replica.
    split_bytes: of the split leaves, one device's part.
    whole_bytes: the leaves kept whole, each all on every device.
    replicated_bytes: the whole state, as today's layout keeps it on every
      device.
    undivided: (path, shape) of the leaves kept whole that hold elements
      (scalars left out), biggest first.
  """
  shards: int
  split_bytes: int
  whole_bytes: int
  replicated_bytes: int
  undivided: tuple[tuple[str, tuple[int, ...]], ...]

  @property
  def per_device_bytes(self) -> int:
    return self.split_bytes + self.whole_bytes

  def describe(self) -> str:
    """One line for the console."""
    mib = _size
    kept = ''
    if self.undivided:
      named = ', '.join(f'{p} {s}' for p, s in self.undivided[:3])
      more = len(self.undivided) - 3
      kept = (f' ({len(self.undivided)} leaves kept whole, that '
              f'{self.shards} does not divide or an override keeps: '
              f'{named}{f", and {more} more" if more > 0 else ""})')
    return (f'state per device {mib(self.per_device_bytes)}: '
            f'{mib(self.split_bytes)} of it split {self.shards} ways, '
            f'{mib(self.whole_bytes)} whole{kept}; '
            f'{mib(self.replicated_bytes)} whole on every device')


def _size(n: int) -> str:
  """'12.4 MiB', '3.0 KiB', '40 B'."""
  for unit, scale in (('GiB', 2**30), ('MiB', 2**20), ('KiB', 2**10)):
    if n >= scale:
      return f'{n / scale:.1f} {unit}'
  return f'{n} B'


def footprint(tree: Any, layout: Any, shards: int) -> Footprint:
  """What one device holds of `tree` placed by `layout` (from `specs`)."""
  split = whole = total = 0
  undivided = []
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  spec_leaves = jax.tree_util.tree_leaves(
      layout, is_leaf=lambda x: isinstance(x, PartitionSpec))
  for (key_path, leaf), spec in zip(leaves, spec_leaves, strict=True):
    shape = tuple(np.shape(leaf))
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
    total += size
    if SHARD_AXIS in tuple(spec):
      split += size // shards
    else:
      whole += size
      if shape:
        undivided.append((size, _path(key_path), shape))
  undivided.sort(key=lambda u: -u[0])
  return Footprint(shards, split, whole, total,
                   tuple((p, s) for _, p, s in undivided))
