"""Replica consistency: every device of every process holds the same
parameters and model state.

In data parallelism the replicas must agree after every step. Silent data
corruption, or a non-deterministic op on one device, breaks that without a
sound. Every `config.integrity_every` steps each process computes, on each
of its devices and from that device's own copy, one checksum per parameter
leaf: the sum, modulo 2**32, of the leaf's raw bits read as unsigned
integers (the model state's leaves too: BatchNorm's statistics are averaged
over the devices after every step and must agree as the parameters do). The
sum is exact and does not depend on the order of addition, and
flipping any one bit changes it. Process 0 gathers every device's checksums
through the coordination service, takes the value most devices hold as the
right one, and every process stops with exit 12 (REPLICAS_DIVERGED) when any
device differs, naming the rank, the device, the step and the first
parameter path that differs, and the newest checkpoint saved before.

A sharded state (runtime/parallelism/state_layout.py) is checked shard by
shard: each device sums the part of each leaf it holds, and a device is
compared with the devices at the same shard position in the other replicas
(`checksums_by_shard`); a leaf kept whole is the same on every device. With
one replica a split leaf has no other copy to compare with.

Example:
  >>> checksums_by_device(run.state.params, parallelism.PMAP)  # (devices, leaves)
  array([[2387103, 912883], ...], dtype=uint32)
"""

import collections
import functools
import json
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
import numpy as np

from runtime.common import exit_codes
from runtime import coordination
from runtime import hooks as hooks_lib
from runtime import parallelism as parallelism_lib
from runtime.parallelism import state_layout

_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}
_KEY = 'podrun/integrity'


class DivergedError(exit_codes.PodrunError):
  """Some device's parameters differ from the others'."""
  exit_code = exit_codes.REPLICAS_DIVERGED


def _leaf_checksum(x: jax.Array) -> jax.Array:
  """uint32 sum of the bits of `x`, modulo 2**32; exact in any order."""
  if x.dtype == jnp.bool_:
    bits = x.astype(jnp.uint32)
  else:
    bits = jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])
  return jnp.sum(bits.astype(jnp.uint32), dtype=jnp.uint32)


def _checksums(tree: Any, device_row: Optional[jax.Array]) -> jax.Array:
  """(1, leaves): one device's checksums of its own copy of `tree`."""
  del device_row  # Only there to map over: pmap needs a mapped argument.
  return jnp.stack([_leaf_checksum(x) for x in jax.tree_util.tree_leaves(tree)
                   ])[None]


@functools.lru_cache(maxsize=None)
def _mapped(par: parallelism_lib.Parallelism) -> tuple[Callable, Any]:
  # A replicated argument is each device's own copy, as the step sees it:
  # one program for every device, compiled once.
  rows = par.put_batch(np.zeros(jax.local_device_count(), np.uint8))
  return par.map(_checksums, in_axes=(None, 0), out_axes=0), rows


def checksums_by_device(tree: Any,
                        par: parallelism_lib.Parallelism) -> np.ndarray:
  """(local devices, leaves) uint32 checksums of each device's own copy.

  Args:
    tree: replicated arrays, placed by `par.replicate` or a step of `par`.
    par: how they are placed.
  """
  return _sums_by_device(tree, par)()


def _sums_by_device(
    tree: Any, par: parallelism_lib.Parallelism) -> Callable[[], np.ndarray]:
  """Starts `checksums_by_device` on the devices; returns what reads it."""
  checksums, rows = _mapped(par)
  out = checksums(tree, rows)
  out.copy_to_host_async()
  leaves = len(jax.tree_util.tree_leaves(tree))

  def read() -> np.ndarray:
    shards = sorted(out.addressable_shards,
                    key=lambda s: (s.device.process_index, s.device.id))
    return np.concatenate(
        [np.asarray(s.data).reshape(-1, leaves) for s in shards])

  return read


def checksums_by_shard(tree: Any,
                       shardings: Any) -> tuple[np.ndarray, list[int]]:
  """(local devices, leaves) uint32 checksums of the part of each leaf
  that each device holds, and each local device's shard position.

  Args:
    tree: global arrays placed by `shardings` (a sharded state's params).
    shardings: NamedShardings on one (replicas, shards) mesh
      (state_layout.mesh).

  Returns:
    (rows, positions): rows in the order of this process's devices in the
    mesh; positions[i], the shard that local device i holds (0 to
    shards - 1), the same for the devices of each replica that should
    agree.
  """
  return _sums_by_shard(tree, shardings)()


def _sums_by_shard(
    tree: Any, shardings: Any) -> Callable[[], tuple[np.ndarray, list[int]]]:
  """Starts `checksums_by_shard` on the devices; returns what reads it."""
  placements, treedef = jax.tree_util.tree_flatten(shardings)
  grid = placements[0].mesh
  rows = _shard_sums(grid, treedef, tuple(p.spec for p in placements))(tree)
  rows.copy_to_host_async()
  leaves = len(jax.tree_util.tree_leaves(tree))
  shards = grid.shape[state_layout.SHARD_AXIS]

  def read() -> tuple[np.ndarray, list[int]]:
    parts = sorted(rows.addressable_shards, key=lambda s: s.index[0].start)
    return (np.concatenate([
        np.asarray(s.data).reshape(-1, leaves) for s in parts
    ]), [s.index[0].start % shards for s in parts])

  return read


@functools.lru_cache(maxsize=None)
def _shard_sums(grid, treedef, spec_leaves: tuple) -> Callable:
  """The jitted per-device sums of the blocks of a tree of `treedef`."""
  specs = jax.tree_util.tree_unflatten(treedef, spec_leaves)
  flat = PartitionSpec((state_layout.REPLICA_AXIS, state_layout.SHARD_AXIS))
  # Each device's own block of each leaf, as it holds it: no gather.
  return jax.jit(
      jax.shard_map(lambda tree: _checksums(tree, None),
                    mesh=grid,
                    in_specs=(specs,),
                    out_specs=flat,
                    check_vma=False))


def leaf_paths(tree: Any) -> list[str]:
  return [
      jax.tree_util.keystr(p)
      for p, _ in jax.tree_util.tree_leaves_with_path(tree)
  ]


def checked(state: Any) -> tuple[dict[str, Any], list[str]]:
  """The part of a TrainState (or of its shardings) every replica must hold
  alike, the parameters and the model state, and each leaf's path
  ('params[...]', 'model_state[...]')."""
  tree = {'params': state.params, 'model_state': state.model_state}
  paths = [
      f'{path[0].key}{jax.tree_util.keystr(path[1:])}'
      for path, _ in jax.tree_util.tree_leaves_with_path(tree)
  ]
  return tree, paths


def outliers(
    rows: dict[tuple[int, int], list[int]],
    paths: list[str],
    positions: Optional[dict[tuple[int, int], int]] = None,
    split: Sequence[bool] = ()
) -> list[str]:
  """'rank R device D: first differs at PATH' for each device off the
  majority of the devices that hold the same part of a leaf.

  A leaf kept whole is compared across every device; a split one (with
  `positions`) across the devices at the same shard position. Where those
  devices split evenly (two replicas), each of them is named.

  Args:
    rows: {(process index, local device index): checksums, one per leaf}.
    paths: each leaf's path, as the message names it (`checked`).
    positions: {the same keys: shard position}; None when every device
      holds the whole parameters.
    split: per leaf, whether it is split (with `positions`).
  """
  keys = sorted(rows)
  shards = len(set(positions.values())) if positions else 1
  first = {}
  for leaf in range(len(paths)):
    groups = collections.defaultdict(list)
    for key in keys:
      by_shard = positions is not None and split[leaf]
      groups[positions[key]
             if positions is not None and by_shard else -1].append(key)
    for members in groups.values():
      counts = collections.Counter(rows[k][leaf] for k in members)
      value, count = counts.most_common(1)[0]
      even = len(counts) > 1 and 2 * count <= len(members)
      for key in members:
        if (even or rows[key][leaf] != value) and key not in first:
          first[key] = leaf
  lines = []
  for (process_index, device), leaf in sorted(first.items()):
    where = (f' (shard {positions[(process_index, device)]} of {shards})'
             if positions is not None and split[leaf] else '')
    lines.append(f'rank {process_index} device {device}{where}: first '
                 f'differs at {paths[leaf]}')
  return lines


class CheckReplicas(hooks_lib.Periodic):
  """Every `every` steps: every device's parameters and model state
  against the others'.

  The sums of a step are started on the devices at that step and read at
  the next call's, when the device has that call to run: reading them at
  once would leave the device idle while the host compares, every check
  (the MNIST MLP on a TPU v5e: 1.33x the steps a second without the wait).
  A save reads them at once: no checkpoint of diverged replicas.

  Args:
    every: config.integrity_every (0: never).
    saved_steps: the steps of the checkpoints on disk, for the message.
  """
  every_name = 'integrity_every'

  def __init__(self, every: int, saved_steps: Callable[[], list[int]]):
    super().__init__(every)
    self._saved_steps = saved_steps
    self._last_good: Optional[int] = None
    # (step, paths, split per leaf or None when replicated, the reader).
    self._pending: Optional[tuple[int, list[str], Optional[list[bool]],
                                  Callable]] = None

  def after_step(self, run) -> None:
    self._finish()  # The sums of an earlier call: on the host by now.
    super().ensure_done(run)  # Starts this step's where due (`work`).

  def ensure_done(self, run) -> None:
    """This step's verdict now, for a save."""
    self.after_step(run)
    self._finish()

  def work(self, run) -> None:
    self._start(run)

  def end(self, run, error) -> None:
    if error is None:
      self._finish()

  def _start(self, run) -> None:
    tree, paths = checked(run.state)
    if not run.state_layout.sharded:
      self._pending = (run.step, paths, None,
                       _sums_by_device(tree, run.parallelism))
      return
    shardings, _ = checked(run.state_layout.shardings)
    split = [
        state_layout.SHARD_AXIS in tuple(s.spec)
        for s in jax.tree_util.tree_leaves(shardings)
    ]
    self._pending = (run.step, paths, split, _sums_by_shard(tree, shardings))

  def _finish(self) -> None:
    """Compares the sums started last, if any; raises DivergedError."""
    if self._pending is None:
      return
    step, paths, pending_split, read = self._pending
    self._pending = None
    split: Sequence[bool] = ()
    if pending_split is None:
      rows, positions = read(), None
    else:
      (rows, positions), split = read(), pending_split
    client = coordination.current()
    if client is None or client.process_count == 1:
      lines = outliers({
          (0, d): list(r) for d, r in enumerate(rows)
      }, paths, None if positions is None else {
          (0, d): p for d, p in enumerate(positions)
      }, split)
    else:
      lines = _gather(client, step, rows, positions, paths, split,
                      self._last_good)
    if lines:
      raise DivergedError(self._message(step, lines))
    self._last_good = step

  def _message(self, step: int, lines: list[str]) -> str:
    before = [
        s for s in self._saved_steps()
        if self._last_good is not None and s <= self._last_good
    ]
    since = (f'they agreed at step {self._last_good}' if self._last_good
             is not None else 'this is the run\'s first check')
    restore = (f'the newest checkpoint saved before is step {max(before)}'
               if before else 'no checkpoint saved since they last agreed')
    return (f'the replicas diverged by step {step} ({since}); ' +
            '; '.join(lines) + f'. The others agree with each other; '
            f'{restore}. Check the named device (silent data corruption) or '
            'a non-deterministic op, and resume from that checkpoint.')


def _gather(client: coordination.Client, step: int, rows: np.ndarray,
            positions: Optional[list[int]], paths: list[str],
            split: Sequence[bool], previous: Optional[int]) -> list[str]:
  """Every process's rows to process 0; its verdict back to every process.

  Process 0 also removes the keys of the previous check, which every
  process has read by the time it publishes this one's rows.
  """

  def decide(published):
    gathered, where = {}, {}
    for process_index, text in published.items():
      sent = json.loads(text)
      for device, row in enumerate(sent['rows']):
        gathered[(process_index, device)] = row
        if sent['positions'] is not None:
          where[(process_index, device)] = sent['positions'][device]
    if previous is not None:
      client.delete(f'{_KEY}/{previous}')
    return json.dumps(outliers(gathered, paths, where or None, split))

  verdict = client.decide_on_0(
      f'{_KEY}/{step}',
      json.dumps({
          'rows': rows.tolist(),
          'positions': positions
      }), decide)
  return json.loads(verdict)
