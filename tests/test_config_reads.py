"""Nothing a config sets goes unread in silence (runtime/config_reads.py):
another trainer's name that nothing read is refused before step 1 with
podrun's name for it; another field of the user's that nothing read is said."""

import dataclasses
import logging

from ml_collections import ConfigDict
import optax
import pytest

from configs import linear_regression as linear_regression_config
from runtime import config_reads
from runtime.checkpoints import checkpoint_meta
from runtime import training
from runtime.workloads import linear_regression

pytestmark = pytest.mark.devices


def _flax_config() -> ConfigDict:
  # Flax's examples' default.py on top of podrun's base config.
  config = linear_regression_config.get_config()
  config.steps = 3
  config.batch_size = 128
  config.num_epochs = 10
  config.learning_rate = 0.1
  return config


def test_another_trainer_s_names_are_refused_before_step_1(tmp_path):
  config = _flax_config()
  task, _ = linear_regression.make_task(config)
  config_reads.start()
  with pytest.raises(config_reads.UnreadConfigError) as e:
    training.train(config, str(tmp_path), task)
  said = str(e.value)
  assert e.value.exit_code == 2
  assert ('batch_size=128, which podrun does not read: set '
          'config.global_batch_size') in said
  assert 'num_epochs=10, which podrun does not read: set config.steps' in said
  assert 'learning_rate=0.1' in said and 'config.optimizer.learning_rate' in said
  assert not (tmp_path / 'metrics.jsonl').exists() or not (
      tmp_path / 'metrics.jsonl').read_text()
  # Recording stopped: ConfigDict is itself again.
  assert ConfigDict.__getattr__ is config_reads._originals['__getattr__']


def test_a_name_the_workload_reads_is_not_refused(tmp_path, caplog):
  config = _flax_config()
  del config['batch_size'], config['num_epochs']
  config.my_own_field = 'kept'
  config_reads.start()
  config.optimizer.learning_rate = config.learning_rate  # The workload reads it.
  task, _ = linear_regression.make_task(config)
  with caplog.at_level(logging.WARNING):
    training.train(config, str(tmp_path), task)
  said = [
      r.getMessage()
      for r in caplog.records
      if 'which nothing in the job read' in r.getMessage()
  ]
  assert said == [
      "the config sets my_own_field='kept', which nothing in the job read: a "
      'name podrun does not know, or one this run had no use for'
  ]
  assert ConfigDict.__getattr__ is config_reads._originals['__getattr__']


def test_a_field_read_late_is_not_named(tmp_path, caplog):
  """A field the workload reads after set-up (in a hook) is read."""
  config = linear_regression_config.get_config()
  config.steps = 3
  config.late_field = 5
  task, _ = linear_regression.make_task(config)

  class ReadsLate:

    def begin(self, run):
      pass

    def after_step(self, run):
      if run.step == 2:
        assert config.late_field == 5

    def end(self, run, error):
      pass

  config_reads.start()
  with caplog.at_level(logging.WARNING):
    training.train(config, str(tmp_path),
                   dataclasses.replace(task, hooks=(ReadsLate(),)))
  assert 'which nothing in the job read' not in caplog.text


def test_without_the_launcher_nothing_is_recorded(tmp_path):
  config = _flax_config()
  task, _ = linear_regression.make_task(config)
  training.train(config, str(tmp_path), task)  # No start(): no check.


def _imagenet_config() -> ConfigDict:
  # The rest of Flax's ImageNet example's configs/default.py.
  config = linear_regression_config.get_config()
  config.steps = 3
  config.momentum = 0.9
  config.half_precision = True
  config.log_every_steps = 100
  config.steps_per_eval = -1
  config.cache = False
  config.shuffle_buffer_size = 16 * 128
  config.warmup_epochs = 5.0
  return config


def test_flax_s_imagenet_names_are_told_with_podrun_s_spelling(tmp_path):
  config = _imagenet_config()
  task, _ = linear_regression.make_task(config)
  config_reads.start()
  with pytest.raises(config_reads.UnreadConfigError) as e:
    training.train(config, str(tmp_path), task)
  said = str(e.value)
  for name, podrun in (('momentum=0.9', 'set config.optimizer.momentum'),
                       ('half_precision=True',
                        "read it in your workload: the model's dtype "
                        '(float16 or bfloat16) and, for float16, '
                        'Task(loss_scale=runtime.DynamicScale())'),
                       ('log_every_steps=100', 'set config.log_every'),
                       ('steps_per_eval=-1',
                        'let your eval_fn choose what it scores'),
                       ('cache=False',
                        'drop it: podrun reads examples by index'),
                       ('shuffle_buffer_size=2048', 'set config.data.shuffle'),
                       ('warmup_epochs=5.0',
                        'set a schedule in the optimizer')):
    assert f'{name}, which podrun does not read: {podrun}' in said, name


def test_flax_s_prefetch_is_told_before_step_1(tmp_path, caplog):
  config = linear_regression_config.get_config()
  config.steps, config.prefetch = 2, 10
  task, _ = linear_regression.make_task(config)
  with caplog.at_level(logging.WARNING):
    training.train(config, str(tmp_path), task)
  assert ("config.prefetch=10: podrun places that many batches on the "
          'devices ahead of the step') in caplog.text


def _flax_run(config, workdir):
  """A Flax-style workload under the launcher's recording: its optimizer
  from top-level names, never config.optimizer.learning_rate."""
  task, _ = linear_regression.make_task(config)  # Before: not recorded.
  config_reads.start()
  try:
    rate = config.learning_rate * config.momentum / config.num_epochs
    return training.train(config, workdir,
                          dataclasses.replace(task, optimizer=optax.sgd(rate)))
  finally:
    config_reads.stop()


def test_a_foreign_name_the_workload_reads_joins_the_resume_check(tmp_path):
  config = _flax_config()
  del config['batch_size']
  config.momentum = 0.9
  _flax_run(config, str(tmp_path))
  config.steps, config.num_epochs = 6, 20
  with pytest.raises(checkpoint_meta.CheckpointError,
                     match=r'config.num_epochs: checkpoint 10, this run 20'):
    _flax_run(config, str(tmp_path))
  # And podrun's default that this workload never reads may change.
  config.num_epochs = 10
  config.optimizer.learning_rate = 0.5
  assert _flax_run(config, str(tmp_path)).start_step == 3


def _lm1b_config() -> ConfigDict:
  # Flax's LM1B example's loop names on top of podrun's base config.
  config = linear_regression_config.get_config()
  config.steps, config.global_batch_size = 3, 64
  config.per_device_batch_size = 4
  config.eval_every_steps = 1000
  config.save_checkpoints = False
  config.restore_checkpoints = True
  config.dropout_rate = 0.0
  return config


def test_flax_s_lm1b_names_are_told_and_a_read_cannot_disarm_them(tmp_path):
  config = _lm1b_config()
  task, _ = linear_regression.make_task(config)
  config_reads.start()
  # The example's init reads these for a dummy batch and its loop.
  _ = (config.per_device_batch_size, config.save_checkpoints,
       config.restore_checkpoints, config.dropout_rate)
  with pytest.raises(config_reads.UnreadConfigError) as e:
    training.train(config, str(tmp_path), task)
  said = str(e.value)
  assert ('per_device_batch_size=4 x 8 devices = 32, but podrun runs '
          'config.global_batch_size=64: set config.global_batch_size') in said
  assert ('eval_every_steps=1000, which podrun does not read: set '
          'config.eval_every') in said
  assert ('save_checkpoints=False, which podrun has no off for: drop it'
          in said)
  assert 'restore_checkpoints' not in said and 'dropout_rate' not in said
  # Agreeing, and read: trained.
  config = _lm1b_config()
  config.global_batch_size = 32
  del config['eval_every_steps'], config['save_checkpoints']
  config_reads.start()
  _ = (config.per_device_batch_size, config.restore_checkpoints,
       config.dropout_rate)
  training.train(config, str(tmp_path / 'agreed'), task)
  config_reads.stop()


def test_a_model_field_at_the_top_level_joins_the_resume_check(tmp_path):
  # LM1B's dropout_rate: a resume with another one is another run.
  config = linear_regression_config.get_config()
  config.steps, config.dropout_rate = 2, 0.0
  task, _ = linear_regression.make_task(config)
  training.train(config, str(tmp_path), task)
  config.steps, config.dropout_rate = 4, 0.3
  with pytest.raises(checkpoint_meta.CheckpointError,
                     match=r'config.dropout_rate: checkpoint 0.0, this run '
                     r'0.3'):
    training.train(config, str(tmp_path), task)
