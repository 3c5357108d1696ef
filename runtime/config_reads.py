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
from runtime import config_base

# Another trainer's top-level name -> what to do instead in podrun.
FOREIGN = {
    'batch_size': 'set config.global_batch_size',
    'train_batch_size': 'set config.global_batch_size',
    'per_device_batch_size': 'set config.global_batch_size (the whole step\'s)',
    'num_epochs': 'set config.steps (epochs x examples / global_batch_size)',
    'num_train_steps': 'set config.steps',
    'max_steps': 'set config.steps',
    'learning_rate': 'set config.optimizer.learning_rate, or the optimizer '
                     'your Task builds',
    'warmup_epochs': 'set a schedule in the optimizer your Task builds '
                     '(Task.schedule logs it)',
    'warmup_steps': 'set a schedule in the optimizer your Task builds '
                    '(Task.schedule logs it)',
    # The rest of Flax's ImageNet example's configs/default.py.
    'momentum': 'set config.optimizer.momentum, read where your Task builds '
                'its optimizer',
    'half_precision': 'read it in your workload: the model\'s dtype (float16 '
                      'or bfloat16) and, for float16, '
                      'Task(loss_scale=runtime.DynamicScale())',
    'log_every_steps': 'set config.log_every',
    'steps_per_eval': 'let your eval_fn choose what it scores '
                      '(runtime.evaluate scores the whole split); '
                      'config.eval_every says how often',
    'checkpoint_every_steps': 'set config.checkpoint_every',
    'cache': 'drop it: podrun reads examples by index (runtime.ArraySource '
             'holds them in memory); read it in your workload',
    'shuffle_buffer_size': 'set config.data.shuffle (podrun shuffles the '
                           'whole data set every epoch)',
    # Flax's LM1B example's loop names.
    'eval_every_steps': 'set config.eval_every',
    'eval_per_device_batch_size': 'set config.eval_batch_size (the whole '
                                  'eval step\'s)',
    'num_eval_steps': 'let your eval_fn choose what it scores '
                      '(runtime.evaluate scores the whole split)',
    'save_checkpoints': 'drop it: podrun saves every config.checkpoint_every '
                        'steps (0: at the end only), and on a preemption',
    'restore_checkpoints': 'drop it: podrun resumes from the newest '
                           'checkpoint in the workdir; point --workdir at a '
                           'new directory to start afresh',
}

# Another trainer's name -> (podrun's field it must agree with, whether the
# name counts per device). A name whose value disagrees is refused read or
# not: a workload that reads Flax's per_device_batch_size for its dummy
# batch still trains podrun's global_batch_size.
AGREES_WITH = {
    'batch_size': ('global_batch_size', False),
    'train_batch_size': ('global_batch_size', False),
    'per_device_batch_size': ('global_batch_size', True),
    'eval_per_device_batch_size': ('eval_batch_size', True),
    'num_train_steps': ('steps', False),
    'max_steps': ('steps', False),
    'eval_every_steps': ('eval_every', False),
    'checkpoint_every_steps': ('checkpoint_every', False),
    'log_every_steps': ('log_every', False),
}
# Flax's switches podrun has no off for: False disagrees, read or not.
ALWAYS_ON = ('save_checkpoints', 'restore_checkpoints')

# Other trainers' names that decide what a run computes where a workload
# reads them: a resumed run must agree with its checkpoint on them, as on
# the trajectory sections (runtime/checkpoints/checkpoint_meta.py).
FOREIGN_TRAJECTORY = (
    'batch_size',
    'train_batch_size',
    'per_device_batch_size',
    'num_epochs',
    'learning_rate',
    'warmup_epochs',
    'warmup_steps',
    'momentum',
    'half_precision',
    'weight_decay',
    # Flax's LM1B example keeps its model's fields at the top level.
    'vocab_size',
    'max_corpus_chars',
    'label_smoothing',
    'max_target_length',
    'logits_via_embedding',
    'num_layers',
    'qkv_dim',
    'emb_dim',
    'mlp_dim',
    'num_heads',
    'dropout_rate',
    'attention_dropout_rate',
    'use_bfloat16')

# podrun's defaults of the trajectory sections that only a workload reads:
# where nothing read one before the run (a workload that reads its own
# name instead), a change of it changes nothing and blocks no resume.
WORKLOAD_DEFAULTS = (('optimizer', 'learning_rate'),)

# Attribute access and get: what code reads a field by; to_dict, items and
# copies go through __getitem__, and read every field alike.
# runtime/config_base.py's top-level fields, which podrun itself reads (some
# only in the supervising launcher): taken from the base config, so the
# names are declared once.
PODRUN_FIELDS = frozenset(config_base.get_config())

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


def unread_defaults(config: ConfigDict) -> list[str]:
  """The WORKLOAD_DEFAULTS nothing read since `start`, as 'section.field';
  [] when not recording."""
  if _reads is None:
    return []
  found = []
  for section, field in WORKLOAD_DEFAULTS:
    holder = config._fields.get(section)  # pylint: disable=protected-access
    if isinstance(
        holder,
        ConfigDict) and field in holder and (id(holder), field) not in _reads:
      found.append(f'{section}.{field}')
  return found


# config.prefetch's default; Flax's examples set 10 for tf.data's host
# buffer, which podrun would take as batches held on every device.
_PREFETCH_SAID_ABOVE = 4


def _say_prefetch(prefetch) -> None:
  if isinstance(prefetch, int) and prefetch > _PREFETCH_SAID_ABOVE:
    logging.warning(
        'config.prefetch=%d: podrun places that many batches on the devices '
        'ahead of the step, each in device memory (default 2, enough to keep '
        'an accelerator busy). Flax\'s examples\' prefetch is tf.data\'s '
        'host buffer, which podrun has no use for: drop it unless you mean '
        'device batches.', prefetch)


def disagreements(config: ConfigDict, num_devices: int) -> dict[str, str]:
  """{another trainer's name: how podrun's own field disagrees with it},
  for the names of AGREES_WITH and ALWAYS_ON the config sets."""
  fields = config._fields  # pylint: disable=protected-access
  found = {}
  for name, (ours, per_device) in AGREES_WITH.items():
    if name not in fields or ours not in fields:
      continue
    value, theirs = fields[name], fields[ours]
    whole = value * num_devices if per_device else value
    if whole != theirs:
      counted = f' x {num_devices} devices = {whole}' if per_device else ''
      found[name] = (f'{name}={value!r}{counted}, but podrun runs '
                     f'config.{ours}={theirs!r}')
  for name in ALWAYS_ON:
    if fields.get(name) is False:
      found[name] = f'{name}=False, which podrun has no off for'
  return found


def check(config: ConfigDict, num_devices: int = 1) -> None:
  """Refuses another trainer's names that nothing read, and those whose
  value disagrees with podrun's own field, read or not (`disagreements`,
  on `num_devices` devices); says where one of podrun's own names means
  something else there (config.prefetch); recording goes on.

  Raises:
    UnreadConfigError: naming each such field and podrun's name for it.
  """
  _say_prefetch(config.get('prefetch'))
  unread_foreign = [f for f in unread(config) if f in FOREIGN]
  # Like the unread names, told only under the launcher's recording: a
  # workload that calls runtime.train itself is its own loop's judge.
  disagree = {} if _reads is None else disagreements(config, num_devices)
  told = [
      f'{f}={config[f]!r}, which podrun does not read: {FOREIGN[f]}'
      for f in unread_foreign
  ] + [
      f'{disagree[f]}: {FOREIGN[f]}' for f in sorted(disagree)
      if f not in unread_foreign
  ]
  if told:
    stop()
    raise UnreadConfigError(
        'the config sets ' + '; '.join(told) +
        '. Another trainer\'s names are refused before step 1 where '
        'nothing in the job read them, or where podrun\'s own field '
        'disagrees. Drop them, set podrun\'s field to agree, or read them '
        'in the workload.')


def finish(config: ConfigDict) -> None:
  """Warns of the user's top-level fields that nothing read in the whole
  run; stops recording."""
  try:
    found = unread(config)
  finally:
    stop()
  if found:
    logging.warning(
        'the config sets %s, which nothing in the job read: '
        'a name podrun does not know, or one this run had no '
        'use for', ', '.join(f'{f}={config[f]!r}' for f in found))
