"""How a run checkpoints, read once from its config by `train`: the values
the checkpoint room's modules take, instead of the whole ConfigDict.

Example:
  >>> options = Checkpointing.of(config, layout.Record('/runs/mnist'))
  >>> options.directory, options.every, options.local.every_steps
  ('/runs/mnist/checkpoints', 500, 100)
"""

import dataclasses
from typing import Any

from ml_collections import ConfigDict

from runtime.checkpoints import checkpoint_meta
from runtime.checkpoints import local_cadence
from runtime.common import layout
from runtime.common import mappings
from runtime import config_reads


@dataclasses.dataclass(frozen=True)
class LocalTier:
  """Each process's own copies on its host's disk (local_checkpoint.py).

  Attributes:
    every_steps: a copy every this many steps (config.local_checkpoint_every;
      0: by steps never).
    budgeted: every_steps is the default's (local_checkpoint_every unset):
      the soonest, with copies further apart where they would block the
      loop more than local_cadence.BLOCKING_SHARE of its time.
    every_s: or about every this many seconds of training
      (config.local_checkpoint_every_s; 0: by time never).
    keep: copies kept (config.keep_local_checkpoints).
    root: where the job's copies go (config.local_checkpoint_dir; '': the
      default, local_checkpoint.default_root()).
    leftover_hours: another job's copies older than this are removed
      (config.local_checkpoint_leftover_hours).
  """
  every_steps: int = 0
  every_s: float = 0.0
  keep: int = 2
  budgeted: bool = False
  root: str = ''
  leftover_hours: float = 24.0

  @property
  def enabled(self) -> bool:
    return self.every_steps > 0 or self.every_s > 0


@dataclasses.dataclass(frozen=True)
class Checkpointing:
  """Both tiers of a run, and what a copy of its state must agree on.

  Attributes:
    enabled: config.checkpointing (False: neither tier, a fresh start).
    directory: the persistent tier's, config.checkpoint_dir or
      WORKDIR/checkpoints.
    every: a persistent save every this many steps (and at the end).
    keep: persistent checkpoints kept.
    async_save: whether a persistent save overlaps the next steps.
    restore: config.restore (False: refuse a directory that holds
      checkpoints rather than resume from it).
    local: the local tier.
    trajectory: the config fields a copy must agree on, 'a.b' keys
      (`trajectory_config`).
    global_batch_size: G, for where the example stream stands at a step.
    seed: the data order's.
  """
  enabled: bool
  directory: str
  every: int
  keep: int
  async_save: bool
  restore: bool
  local: LocalTier
  trajectory: dict[str, Any]
  global_batch_size: int
  seed: int

  @classmethod
  def of(cls, config: ConfigDict, record: layout.Record) -> 'Checkpointing':
    """Reads a config made from runtime/config_base.py."""
    local_every = config.get('local_checkpoint_every')
    return cls(enabled=bool(config.get('checkpointing', True)),
               directory=directory(config, record),
               every=config.checkpoint_every,
               keep=config.keep_checkpoints,
               async_save=bool(config.async_checkpointing),
               restore=bool(config.restore),
               local=LocalTier(
                   every_steps=(local_cadence.DEFAULT_EVERY_STEPS
                                if local_every is None else local_every),
                   budgeted=local_every is None,
                   every_s=config.get('local_checkpoint_every_s', 0.0) or 0.0,
                   keep=config.keep_local_checkpoints,
                   root=config.get('local_checkpoint_dir', '') or '',
                   leftover_hours=config.get('local_checkpoint_leftover_hours',
                                             24.0)),
               trajectory=trajectory_config(config),
               global_batch_size=config.global_batch_size,
               seed=config.seed)


def trajectory_config(config: ConfigDict) -> dict[str, Any]:
  """The config fields a checkpoint must agree on, flattened to 'a.b' keys.

  Every field of TRAJECTORY_SECTIONS, and another trainer's top-level names
  that decide a run (config_reads.FOREIGN_TRAJECTORY: Flax's num_epochs,
  learning_rate, momentum, ...), but those config.restore_may_change names
  (a field, or a whole section) and podrun's defaults that nothing read
  before the run (config_reads.unread_defaults).
  """
  allowed = set(config.restore_may_change) | set(
      config_reads.unread_defaults(config)) | set(checkpoint_meta.HOW_NOT_WHAT)
  sections = {
      k: v
      for k, v in config.to_dict().items()
      if k in checkpoint_meta.TRAJECTORY_SECTIONS or
      k in config_reads.FOREIGN_TRAJECTORY
  }
  flat = mappings.flatten(sections)
  return {
      k: v for k, v in flat.items() if not any(k == a or k.startswith(a + '.')
                                               for a in allowed)
  }


def directory(config: ConfigDict, record: layout.Record) -> str:
  """Where the run's checkpoints go: config.checkpoint_dir or the record's
  checkpoints/ (for a bucket's record, the bucket's).

  Example:
    >>> directory(config, layout.Record('/tmp/w'))  # checkpoint_dir == ''
    '/tmp/w/checkpoints'
  """
  return config.checkpoint_dir or record.checkpoints()
