"""Replica consistency: every device of every process holds the same
parameters.

In data parallelism the replicas must agree after every step. Silent data
corruption, or a non-deterministic op on one device, breaks that without a
sound. Every `config.integrity_every` steps each process computes, on each
of its devices and from that device's own copy, one checksum per parameter
leaf: the sum, modulo 2**32, of the leaf's raw bits read as unsigned
integers. The sum is exact and does not depend on the order of addition, and
flipping any one bit changes it. Process 0 gathers every device's checksums
through the coordination service, takes the value most devices hold as the
right one, and every process stops with exit 12 (REPLICAS_DIVERGED) when any
device differs, naming the rank, the device, the step and the first
parameter path that differs, and the newest checkpoint saved before.

Example:
  >>> checksums_by_device(run.state.params, parallelism.PMAP)  # (devices, leaves)
  array([[2387103, 912883], ...], dtype=uint32)
"""

import collections
import functools
import json
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from runtime.common import exit_codes
from runtime import coordination
from runtime import hooks as hooks_lib
from runtime import parallelism as parallelism_lib

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


def _checksums(tree: Any, device_row: jax.Array) -> jax.Array:
  """(1, leaves): one device's checksums of its own copy of `tree`."""
  del device_row  # Only there to map over: pmap needs a mapped argument.
  return jnp.stack([_leaf_checksum(x)
                    for x in jax.tree_util.tree_leaves(tree)])[None]


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
  checksums, rows = _mapped(par)
  out = checksums(tree, rows)
  leaves = len(jax.tree_util.tree_leaves(tree))
  shards = sorted(out.addressable_shards,
                  key=lambda s: (s.device.process_index, s.device.id))
  return np.concatenate([np.asarray(s.data).reshape(-1, leaves)
                         for s in shards])


def leaf_paths(tree: Any) -> list[str]:
  return [jax.tree_util.keystr(p)
          for p, _ in jax.tree_util.tree_leaves_with_path(tree)]


def outliers(rows: dict[tuple[int, int], list[int]], paths: list[str]
             ) -> list[str]:
  """'rank R device D: first differs at PATH' for each device off the majority.

  Args:
    rows: {(process index, local device index): checksums, one per leaf}.
    paths: each leaf's path.
  """
  majority, _ = collections.Counter(
      tuple(r) for r in rows.values()).most_common(1)[0]
  lines = []
  for (process_index, device), row in sorted(rows.items()):
    if tuple(row) != majority:
      first = next(i for i, (a, b) in enumerate(zip(row, majority)) if a != b)
      lines.append(f'rank {process_index} device {device}: first differs at '
                   f'params{paths[first]}')
  return lines


class CheckReplicas(hooks_lib.Periodic):
  """Every `every` steps: every device's parameters against the others'.

  Args:
    every: config.integrity_every (0: never).
    saved_steps: the steps of the checkpoints on disk, for the message.
  """

  def __init__(self, every: int, saved_steps: Callable[[], list[int]]):
    super().__init__(every)
    self._saved_steps = saved_steps
    self._last_good: Optional[int] = None

  def work(self, run) -> None:
    rows = checksums_by_device(run.state.params, run.parallelism)
    client = coordination.current()
    paths = leaf_paths(run.state.params)
    if client is None or client.process_count == 1:
      lines = outliers({(0, d): list(r) for d, r in enumerate(rows)}, paths)
    else:
      lines = _gather(client, run.step, rows, paths, self._last_good)
    if lines:
      raise DivergedError(self._message(run.step, lines))
    self._last_good = run.step

  def _message(self, step: int, lines: list[str]) -> str:
    before = [s for s in self._saved_steps()
              if self._last_good is not None and s <= self._last_good]
    since = (f'they agreed at step {self._last_good}' if self._last_good
             is not None else 'this is the run\'s first check')
    restore = (f'the newest checkpoint saved before is step {max(before)}'
               if before else 'no checkpoint saved since they last agreed')
    return (f'the replicas diverged by step {step} ({since}); ' +
            '; '.join(lines) + f'. The others agree with each other; '
            f'{restore}. Check the named device (silent data corruption) or '
            'a non-deterministic op, and resume from that checkpoint.')


def _gather(client: coordination.Client, step: int, rows: np.ndarray,
            paths: list[str], previous: Optional[int]) -> list[str]:
  """Every process's rows to process 0; its verdict back to every process.

  Process 0 also removes the keys of the previous check, which every
  process has read by the time it publishes this one's rows.
  """
  def decide(published):
    gathered = {(process_index, device): row
                for process_index, text in published.items()
                for device, row in enumerate(json.loads(text))}
    if previous is not None:
      client.delete(f'{_KEY}/{previous}')
    return json.dumps(outliers(gathered, paths))
  verdict = client.decide_on_0(f'{_KEY}/{step}', json.dumps(rows.tolist()),
                            decide)
  return json.loads(verdict)
