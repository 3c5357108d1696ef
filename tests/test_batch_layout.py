"""Padding never enters a collective of the model, and nothing a refused run
wrote steers the next (runtime/batch_layout.py,
runtime/checkpoints/batch_limit.py)."""

import dataclasses
import json
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import linear_regression as linear_regression_config
from runtime import batch_layout
from runtime import config_reads
from runtime import options as options_lib
from runtime import training
from runtime.parallelism import microbatches
from runtime.workloads import linear_regression

pytestmark = pytest.mark.devices


class _Normalised(nn.Module):
  """Flax's ImageNet habit: BatchNorm over every device's rows."""
  axis_name: str

  @nn.compact
  def __call__(self, x):
    x = nn.BatchNorm(use_running_average=False,
                     axis_name=self.axis_name,
                     momentum=0.9)(x)
    return nn.Dense(1)(x)[:, 0]


def _bn_task(config, axis_name='devices'):
  """linear_regression's data through a cross-device BatchNorm."""
  task, _ = linear_regression.make_task(config)
  model = _Normalised(axis_name)
  variables = jax.device_get(
      model.init(jax.random.key(0),
                 np.zeros((2, config.data.features), np.float32)))

  def loss_fn(params, model_state, batch):
    y, updates = model.apply({
        'params': params,
        **model_state
    },
                             batch['x'],
                             mutable=['batch_stats'])
    loss = jnp.mean((y - batch['y'])**2)
    return loss, ({'mse': loss}, {'batch_stats': updates['batch_stats']})

  return dataclasses.replace(
      task,
      params=variables['params'],
      loss_fn=loss_fn,
      model_state={'batch_stats': variables['batch_stats']})


def _config(batch, steps=3):
  config = linear_regression_config.get_config()
  config.global_batch_size, config.steps = batch, steps
  config.checkpointing = False
  return config


def _first_loss(workdir) -> float:
  with open(workdir / 'metrics.jsonl') as f:
    return json.loads(f.readline())['loss']


def test_a_padded_batch_is_refused_where_batchnorm_spans_the_devices(tmp_path):
  # 100 on 8 devices: 5 groups of 20 and 3 of padding, whose rows the
  # BatchNorm's psum would sum into every device's mean and variance.
  config = _config(100)
  with pytest.raises(
      batch_layout.PaddingError,
      match=re.escape(
          'global batch size 100 on 8 devices would be laid out as 1 '
          'microbatch(es) of 20 example(s) per device, 3 of 8 group(s) padding '
          "(38% of the passes), but loss_fn takes a collective over the axis "
          "'devices' (psum: a cross-device BatchNorm")) as refused:
    training.train(config, str(tmp_path), _bn_task(config))
  said = str(refused.value)
  assert ('set config.global_batch_size to 96 or 104 (multiples of 8); or '
          'run on 5 or 10 devices (dividing 100)') in said
  assert refused.value.exit_code == 2
  # Refused before step 1: nothing written that steers a later run.
  assert not (tmp_path / 'device_batch_limit.json').exists()
  assert not (tmp_path / 'metrics.jsonl').exists()


def test_a_loss_without_collectives_still_pads(tmp_path):
  config = _config(100, steps=1)
  task, _ = linear_regression.make_task(config)
  result = training.train(config, str(tmp_path), task)
  assert result.topology == {
      'num_processes': 1,
      'num_devices': 8,
      'microbatches': 1
  }
  mixing = batch_layout.loss_mixing(
      task.loss_fn, None, False,
      training.step_lib.init_state(task.params, task.optimizer), task.data,
      'devices', 8)
  assert mixing(20) == ()


def test_the_unpadded_layout_is_chosen_where_one_exists(tmp_path):
  # 40 on 8 devices of at most 4 a pass: plan() takes 2 passes of 4 (10
  # real groups, 6 of padding); the loss mixes devices, so 5 passes of 1.
  config = _config(40, steps=4)
  config.device_batch_limit = 4
  task = _bn_task(config)
  chosen = batch_layout.choose(config.global_batch_size,
                               options_lib.Groups.of(config),
                               _Topology(),
                               has_model_state=True,
                               mixing=batch_layout.loss_mixing(
                                   task.loss_fn, None, True,
                                   training.step_lib.init_state(
                                       task.params, task.optimizer, 0,
                                       task.model_state), task.data, 'devices',
                                   8))
  assert (chosen.microbatch_size, chosen.microbatches,
          chosen.padded_groups) == (1, 5, 0)
  assert chosen.describe() == (
      "5 microbatch(es) of 1 example(s) per device; unpadded, since loss_fn "
      "takes a collective over 'devices' (psum); groups of 4 would pad 6 of "
      '16')
  result = training.train(config, str(tmp_path), task)
  assert result.topology['microbatches'] == 5


@dataclasses.dataclass
class _Topology:
  process_count: int = 1
  local_device_count: int = 8
  process_index: int = 0


def test_a_kept_group_size_that_would_pad_gives_way_to_no_padding(tmp_path):
  # The first attempt ran 48 on 3 devices: groups of 16, kept. On 8 devices
  # those would be 3 real groups and 5 of padding; with BatchNorm across
  # the devices, groups of 6 instead, trained as a fresh workdir trains.
  config = _config(48)
  task = _bn_task(config)
  fresh = training.train(config, str(tmp_path / 'fresh'), task)
  kept = tmp_path / 'kept'
  kept.mkdir()
  (kept / 'device_batch_limit.json').write_text(
      json.dumps({
          'device_batch_limit': 16,
          'num_devices': 3,
          'global_batch_size': 48
      }))
  again = training.train(config, str(kept), task)
  assert again.fingerprint == fresh.fingerprint
  np.testing.assert_array_equal(
      jax.tree_util.tree_leaves(again.model_state)[0],
      jax.tree_util.tree_leaves(fresh.model_state)[0])


def test_a_refused_run_leaves_nothing_that_steers_the_corrected_one(tmp_path):
  # Flax's batch_size left unread: refused before step 1. The corrected run
  # (another batch, same workdir) trains as a fresh workdir does.
  config = _config(256)
  config.batch_size = 256
  config_reads.start()
  with pytest.raises(config_reads.UnreadConfigError):
    training.train(config, str(tmp_path / 'w'), _bn_task(config))
  assert not (tmp_path / 'w' / 'device_batch_limit.json').exists()
  config = _config(128)
  corrected = training.train(config, str(tmp_path / 'w'), _bn_task(config))
  fresh = training.train(config, str(tmp_path / 'fresh'), _bn_task(config))
  assert corrected.fingerprint == fresh.fingerprint
  assert _first_loss(tmp_path / 'w') == _first_loss(tmp_path / 'fresh')
  # Kept only now, once a step has run: for the batch it ran.
  kept = json.loads((tmp_path / 'w' / 'device_batch_limit.json').read_text())
  assert kept == {
      'device_batch_limit': 16,
      'num_devices': 8,
      'global_batch_size': 128
  }


def test_a_limit_kept_for_another_batch_is_ignored_and_said(tmp_path, caplog):
  config = _config(128)
  (tmp_path / 'device_batch_limit.json').write_text(
      json.dumps({
          'device_batch_limit': 32,
          'num_devices': 8,
          'global_batch_size': 256
      }))
  with caplog.at_level('INFO'):
    result = training.train(config, str(tmp_path), _bn_task(config))
  assert result.topology['microbatches'] == 1
  fresh = training.train(config, str(tmp_path / 'fresh'), _bn_task(config))
  assert result.fingerprint == fresh.fingerprint
  line = next(r.getMessage()
              for r in caplog.records
              if r.getMessage().startswith('training 3 steps'))
  assert ('1 microbatch(es) of 16 example(s) per device; '
          'device_batch_limit.json (groups of 32) was made for global batch '
          '256, not 128: ignored') in line


def test_an_elastic_count_that_would_pad_a_mixing_loss_is_refused_first():
  mixing = lambda rows: ('psum',)
  # 64 on 2 to 4 processes of 2 devices: 6 devices would pad.
  with pytest.raises(
      batch_layout.PaddingError,
      match=re.escape(
          'this elastic job may run on 2 to 4 processes, and on 3 x 2 devices: '
          'global batch size 64 on 6 devices would be laid out')):
    batch_layout.check_elastic_layouts(64, 2, (None, None, None), (2, 4),
                                       mixing)
  # Without a mixing loss the same counts pad, as before.
  assert batch_layout.check_elastic_layouts(64, 2, (None, None, None),
                                            (2, 4)) == {16, 8}


def test_unpadded_layouts():
  assert microbatches.unpadded(100, 8) is None
  assert microbatches.unpadded(40, 8,
                               device_batch_limit=4) == (microbatches.Layout(
                                   40, 8, 1, 5))
  assert microbatches.unpadded(96, 8, microbatches=3) == (microbatches.Layout(
      96, 8, 4, 3))
  assert microbatches.batches_without_padding(100, 8) == (96, 104)
  assert microbatches.batches_without_padding(96, 8) == (96,)
