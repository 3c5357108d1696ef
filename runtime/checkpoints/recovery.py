"""Where a run resumes from: the newest copy of the state anywhere in the job.

At start every process says, through the coordination service, which steps the
local tier on its disk holds, whatever process index wrote them
(runtime/checkpoints/local_checkpoint.py); process 0 adds the persistent tier's
latest (runtime/checkpoints/checkpoint.py). All of them then take the same
decision (`plan`, a pure function):

- the newest step anyone holds, locally or persistently;
- when every process holds it locally, each reads its own copy ('local');
- when only some do, the lowest-numbered of them reads it and sends it to
  every other process in one collective over the devices ('peer': the
  key-value store is for small values, not for the state);
- when no process holds it locally, everyone reads the persistent tier
  ('persistent').

A replicated state's copy restores every process, whatever the topology
that wrote it: a 1x8 copy restores 2x4. The broadcast sends the state's
bytes, so every process continues bit-exact.

A sharded state's local copy is its process's part
(runtime/checkpoints/shard_parts.py): a step counts as held when every
position in a replica has a holder, and a 'peer' restore takes each
position's part from its lowest-numbered holder, selected on the devices
as bits. The persistent tier restores it straight into its shardings.

Example:
  >>> step, state, tier = restore(config, persistent, local, state, 60000)
  >>> tier
  'peer'
"""

import dataclasses
import itertools
import json
import os
from typing import Any, Optional

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from runtime.checkpoints import checkpoint
from runtime.checkpoints import checkpoint_meta
from runtime.checkpoints import options as checkpoint_options
from runtime.common import goodput
from runtime import coordination
from runtime.checkpoints import local_checkpoint
from runtime.checkpoints import shard_parts

_KEY = 'podrun/restore'


@dataclasses.dataclass(frozen=True)
class Plan:
  """What every process does to restore.

  Attributes:
    step: the step to resume from; None starts afresh.
    tier: 'local' (every process reads its own copy), 'peer' (`source`
      reads its copy and sends it), 'persistent', or 'fresh'.
    source: the process that sends the state ('peer' only).
    holders: the processes that hold `step` locally.
    sources: with positions (a sharded state), {position: the process that
      sends that position's part} ('peer' only).
  """
  step: Optional[int]
  tier: str
  source: Optional[int] = None
  holders: tuple[int, ...] = ()
  sources: Optional[dict[int, int]] = None


def plan(local_steps: dict[int, list[int]],
         persistent_step: Optional[int],
         positions: Optional[dict[int, int]] = None) -> Plan:
  """The restore every process agrees on.

  Args:
    local_steps: {process id: steps its local tier holds}, every process.
    persistent_step: the persistent tier's latest step, or None.
    positions: {process id: its position in its replica}, when each
      process's copy is only its part of a sharded state
      (runtime/checkpoints/shard_parts.py): a step restores from the local
      tier only when every position has a holder. None: every copy is
      whole.

  Example:
    >>> plan({0: [400, 450], 1: []}, persistent_step=0)
    Plan(step=450, tier='peer', source=0, holders=(0,), sources=None)
  """
  places = positions or {p: 0 for p in local_steps}

  def holders_of(step):
    return tuple(sorted(p for p, steps in local_steps.items() if step in steps))

  def whole(step):
    held = {places[p] for p in holders_of(step)}
    return held == set(places.values())

  newest_local = max(
      (s for steps in local_steps.values() for s in steps if whole(s)),
      default=None)
  candidates = [s for s in (newest_local, persistent_step) if s is not None]
  if not candidates:
    return Plan(None, 'fresh')
  step = max(candidates)
  holders = holders_of(step) if step == newest_local else ()
  if not holders:
    return Plan(step, 'persistent')
  if len(holders) == len(local_steps):
    return Plan(step, 'local', holders=holders)
  sources: Optional[dict[int, int]] = None
  if positions is not None:
    sources = {}
    for process in holders:
      sources.setdefault(places[process], process)
  return Plan(step, 'peer', source=holders[0], holders=holders, sources=sources)


def _exchange(
    local_steps: list[int], persistent_step: Optional[int]
) -> tuple[dict[int, list[int]], Optional[int]]:
  """Every process's local steps and process 0's persistent step."""
  client = coordination.current()
  if client is None or client.process_count == 1:
    return {0: local_steps}, persistent_step
  # Process 0's view of the persistent tier is the one that counts.
  published = client.exchange(
      f'{_KEY}/steps',
      json.dumps({
          'local': local_steps,
          'persistent': persistent_step
      }))
  everyone = {i: json.loads(text) for i, text in published.items()}
  return ({
      i: v['local'] for i, v in everyone.items()
  }, everyone[0]['persistent'])


def _who_failed(failed: bool, attempt: int) -> list[int]:
  """The processes whose read of their local copy failed, on every
  process."""
  client = coordination.current()
  if client is None or client.process_count == 1:
    return [jax.process_index()] if failed else []
  published = client.exchange(f'{_KEY}/failed/{attempt}',
                              '1' if failed else '0')
  return sorted(i for i, text in published.items() if text == '1')


def to_words(state: Any) -> np.ndarray:
  """The bytes of every array of `state`, in tree order, as uint32 words
  (zero-padded to a whole word)."""
  arrays = [
      np.ascontiguousarray(leaf) for leaf in jax.tree_util.tree_leaves(state)
  ]
  flat = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays] or
                        [np.zeros(0, np.uint8)])
  padded = np.zeros(-(-flat.size // 4) * 4, np.uint8)
  padded[:flat.size] = flat
  return padded.view(np.uint32)


def from_words(words: np.ndarray, like: Any) -> Any:
  """The inverse of `to_words`: arrays shaped and typed as `like`'s."""
  raw = np.asarray(words, np.uint32).view(np.uint8)
  leaves, treedef = jax.tree_util.tree_flatten(like)
  out, at = [], 0
  for leaf in leaves:
    a = np.asarray(leaf)
    out.append(raw[at:at + a.nbytes].view(a.dtype).reshape(a.shape).copy())
    at += a.nbytes
  return jax.tree_util.tree_unflatten(treedef, out)


def broadcast(state: Any, is_source: bool) -> Any:
  """`state` as the source process holds it, on every process.

  The bytes of every array travel as one uint32 vector in one collective
  over the devices (a sum with zeros from every other process, which never
  carries), so floats arrive bit for bit, -0.0 and NaN payloads included.

  Args:
    state: host arrays; on every process the same tree, shapes and dtypes
      (the source's values, anything elsewhere).
    is_source: whether this process sends.
  """
  words = multihost_utils.broadcast_one_to_all(to_words(state),
                                               is_source=is_source)
  return from_words(words, state)


def check_local(local: local_checkpoint.LocalCheckpoints,
                trajectory: dict[str, Any],
                like: Any,
                num_examples: int,
                parts: Optional['_Parts'] = None) -> list[int]:
  """The steps this process can restore from its own disk (whatever index
  wrote them), after checking the newest against this run's `trajectory`
  (checkpoints/options.py `trajectory_config`) and data. A copy that cannot be read
  (a file truncated or removed) is removed and not offered; with `parts`
  (a sharded state), neither is a copy of another position or layout, or a
  whole one, which stays.

  Raises:
    CheckpointError: when the newest copy was made by a different run or on
      other data, naming the difference.
  """
  for step in list(local.held()):
    why = local.unreadable(step, parts.like if parts else like)
    if why is not None:
      local.set_aside(step, why)
  held = local.held()
  if parts is not None:
    held = {
        step: where
        for step, where in held.items()
        if shard_parts.fits(local.meta(step).get('part'), parts.record)
    }
  else:  # A sharded state's part restores no replicated run.
    held = {
        step: where
        for step, where in held.items()
        if 'part' not in local.meta(step)
    }
  steps = list(held)
  if steps:
    checkpoint_meta.check(
        local.meta(steps[-1]), trajectory, like, num_examples, steps[-1],
        f'the local copy {held[steps[-1]]} '
        f'(step {steps[-1]})')
  return steps


def restore(options: checkpoint_options.Checkpointing,
            persistent: Optional[checkpoint.Checkpoints],
            local: Optional[local_checkpoint.LocalCheckpoints],
            state: Any,
            num_examples: int,
            shardings: Any = None) -> tuple[int, Any, str]:
  """(step, state, tier) to start from: the one place that decides.

  Without checkpoints, or with config.restore=False (`options.restore`),
  the run starts afresh
  ('fresh'); config.restore=False refuses a directory that already holds
  checkpoints, then drops this job's earlier local copies. Otherwise the
  newest copy anywhere in the job, as the module docstring says; the
  goodput ledger notes the tier.

  Args:
    options: this run's (restore); every copy is checked against its
      trajectory.
    persistent: the persistent tier, or None without checkpoints.
    local: this process's local tier, or None without one.
    state: the freshly initialised TrainState (host arrays): the tree,
      shapes and dtypes to restore into.
    num_examples: the size of the training data.
    shardings: a sharded state's NamedShardings (a TrainState of them):
      the persistent tier then restores global arrays placed by them, each
      process reading only its devices' parts. The local tiers and a fresh
      start give host arrays either way.

  Raises:
    CheckpointError: when a copy cannot be used here, or config.restore is
      False and checkpoints exist.
  """
  if persistent is None:
    return 0, state, 'fresh'
  if not options.restore:
    checkpoint.refuse_existing(persistent)
    if local is not None:
      local.clear()  # An earlier job's copies: this one starts afresh.
    return 0, state, 'fresh'
  step, state, tier = _restore_newest(options.trajectory, persistent, local,
                                      state, num_examples, shardings)
  goodput.current().note(restore_tier=tier, restore_step=step)
  return step, state, tier


def _restore_newest(trajectory: dict[str,
                                     Any], persistent: checkpoint.Checkpoints,
                    local: Optional[local_checkpoint.LocalCheckpoints],
                    state: Any, num_examples: int,
                    shardings: Any) -> tuple[int, Any, str]:
  # A sharded state's local copies are each process's own part.
  parts = None if shardings is None else _Parts(shardings, state)
  local_steps = (check_local(local, trajectory, state, num_examples, parts)
                 if local else [])
  persistent_step = persistent.latest_step() if persistent else None
  everyone, persistent_step = _exchange(local_steps, persistent_step)
  me = jax.process_index()
  for attempt in itertools.count():
    decided = plan(everyone, persistent_step,
                   parts.positions if parts else None)
    if decided.tier == 'fresh':
      return 0, state, 'fresh'
    assert decided.step is not None  # Every tier but 'fresh' names a step.
    step = decided.step
    senders = (f'process {decided.source}'
               if not decided.sources else 'process(es) ' +
               ', '.join(str(p) for p in sorted(set(decided.sources.values()))))
    # Said before the read, which may take minutes from a bucket.
    logging.info(
        'restoring step %d from %s', step, {
            'persistent': 'the persistent tier',
            'local': 'each process\'s local copy',
            'peer': f'{senders}\'s local copy'
        }[decided.tier])
    if decided.tier == 'persistent':
      # The step process 0 saw, not each process's own latest_step(): on a
      # bucket a process may list a newer or older step than the others.
      assert persistent is not None  # Its tier is planned from its step.
      where = os.path.join(persistent.path, str(step))
      checkpoint_meta.check(persistent.meta(step), trajectory, state,
                            num_examples, step, where)
      restored = persistent.load(step, state, shardings)
      logging.info('restored %s (step %d)', where, step)
      return step, restored, 'persistent'
    # A peer restore reads only the senders' copies.
    readers = (decided.holders if decided.tier == 'local' else
               tuple(decided.sources.values()) if decided.sources else
               (decided.source,))
    mine, failed = None, False
    if me in readers:
      assert local is not None  # A holder of a local copy has the tier.
      try:
        mine = local.load(step, parts.like if parts else state)
      except local_checkpoint.UNREADABLE as e:
        # Garbled inside (check_local reads only the zip's directory).
        local.set_aside(step, f'{type(e).__name__}: {e}')
        failed = True
    unread = _who_failed(failed, attempt)
    if not unread:
      break
    # Plan again without the copies that failed: another holder, an older
    # step or the persistent tier.
    for process in unread:
      everyone[process] = [s for s in everyone[process] if s != step]
  if parts is not None:
    mine = (shard_parts.place(mine, shardings, state)
            if decided.tier == 'local' else shard_parts.assemble(
                mine, shardings, state, decided.sources or {}))
  elif decided.tier == 'peer':
    mine = broadcast(state if mine is None else mine,
                     is_source=me == decided.source)
  tier = 'local' if me in decided.holders else 'peer'
  logging.info(
      'restored step %d from %s', step, 'this process\'s local copy'
      if tier == 'local' else f'{senders}\'s local copy')
  return step, mine, tier


class _Parts:
  """What restoring a sharded state's local parts needs: every process's
  position, and this process's part's shapes and record."""

  def __init__(self, shardings: Any, like: Any):
    grid = jax.tree_util.tree_leaves(shardings)[0].mesh
    where = shard_parts.positions(grid)
    self.positions = {p: position.index for p, position in where.items()}
    self.record = shard_parts.record(shardings, jax.process_index())
    self.like = shard_parts.like_own(like, shardings)
