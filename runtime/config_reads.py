"""Which fields of a job's config nothing read, said before step 1.

A config may set fields no code reads: another trainer's names (Flax's
examples set `batch_size`, `num_epochs` and a top-level `learning_rate`),
or a typo. The launcher records which fields are read from the moment it
hands the config to the workload (`start`). `runtime.train` checks at the
end of its set-up (`check`): another trainer's name that nothing read is
refused with podrun's name for it. At the end of the run (`finish`), any
other top-level field of the user's own that nothing read, in set-up or
since (a hook, a data loader and an evaluation may read late), is named in
a warning.

Example:
  >>> config_reads.start()                 # the launcher, before the workload
  >>> config_reads.check(config)            # runtime.train, before step 1
  >>> config_reads.finish(config)           # runtime.train, after the last
"""

from typing import Optional

from absl import logging
from ml_collections import ConfigDict

from runtime.common import exit_codes

# Another trainer's top-level name -> what podrun reads instead.
FOREIGN = {
    'batch_size': 'config.global_batch_size',
    'train_batch_size': 'config.global_batch_size',
    'per_device_batch_size': 'config.global_batch_size (the whole step\'s)',
    'num_epochs': 'config.steps (epochs x examples / global_batch_size)',
    'num_train_steps': 'config.steps',
    'max_steps': 'config.steps',
    'learning_rate': 'config.optimizer.learning_rate, or the optimizer your '
                     'Task builds',
    'warmup_epochs': 'a schedule in the optimizer your Task builds '
                     '(Task.schedule logs it)',
    'warmup_steps': 'a schedule in the optimizer your Task builds '
                    '(Task.schedule logs it)',
}

# Attribute access and get: what code reads a field by; to_dict, items and
# copies go through __getitem__, and read every field alike.
# runtime/config_base.py's top-level fields, which podrun itself reads (some
# only in the supervising launcher); tests/test_config_reads.py holds them
# equal.
PODRUN_FIELDS = frozenset((
    'async_checkpointing', 'axis_name', 'checkpoint_dir', 'checkpoint_every',
    'checkpointing', 'data', 'device_batch_limit', 'eval_batch_size',
    'eval_every', 'global_batch_size', 'integrity_every', 'keep_checkpoints',
    'keep_local_checkpoints', 'local_checkpoint_dir', 'local_checkpoint_every',
    'local_checkpoint_every_s', 'local_checkpoint_leftover_hours', 'log_every',
    'max_steps_in_flight', 'microbatch_size', 'microbatches', 'model',
    'optimizer', 'parallelism', 'prefetch', 'profile', 'replica', 'restore',
    'restore_may_change', 'retry_exit_codes', 'seed', 'shard_dims',
    'state_layout', 'steps', 'steps_per_dispatch', 'tensorboard', 'topology',
    'workload'))

_METHODS = ('__getattr__', 'get')
# (id of a ConfigDict, field) read since `start`; None when not recording.
_reads: Optional[set] = None
_originals: dict = {}


class UnreadConfigError(exit_codes.ConfigError):
  """Another trainer's config name that nothing read (exit 2)."""


def start() -> None:
  """Records every field read from any ConfigDict from now until `stop`."""
  global _reads
  if _reads is not None:
    return
  _reads = set()
  for name in _METHODS:
    original = _originals.setdefault(name, ConfigDict.__dict__[name])

    def read(self, key, *args, _original=original, **kwargs):
      if _reads is not None:
        _reads.add((id(self), key))
      return _original(self, key, *args, **kwargs)
    setattr(ConfigDict, name, read)


def stop() -> None:
  """Puts ConfigDict back as it was."""
  global _reads
  _reads = None
  for name, original in _originals.items():
    setattr(ConfigDict, name, original)


def unread(config: ConfigDict) -> list[str]:
  """The top-level fields of `config` that are not podrun's and that
  nothing read since `start`; [] when not recording."""
  if _reads is None:
    return []
  fields = list(config._fields)  # pylint: disable=protected-access
  return sorted(f for f in fields
                if f not in PODRUN_FIELDS and (id(config), f) not in _reads)


def check(config: ConfigDict) -> None:
  """Refuses another trainer's names that nothing read; recording goes on.

  Raises:
    UnreadConfigError: naming each such field and podrun's name for it.
  """
  foreign = [f for f in unread(config) if f in FOREIGN]
  if foreign:
    stop()
    raise UnreadConfigError(
        'the config sets ' + '; '.join(
            f'{f}={config[f]!r}, which podrun does not read: set '
            f'{FOREIGN[f]}' for f in foreign) +
        '. Nothing in the job read them before step 1. Drop them, or read '
        'them in the workload.')


def finish(config: ConfigDict) -> None:
  """Warns of the user's top-level fields that nothing read in the whole
  run; stops recording."""
  try:
    found = unread(config)
  finally:
    stop()
  if found:
    logging.warning('the config sets %s, which nothing in the job read: '
                    'a name podrun does not know, or one this run had no '
                    'use for',
                    ', '.join(f'{f}={config[f]!r}' for f in found))
