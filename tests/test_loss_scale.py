"""The dynamic loss scale equals Flax's DynamicScale step for step on 8
devices: the same updates, the same skipped steps, the same scale
(runtime/loss_scale.py)."""

import dataclasses
import functools
import json

from flax.training import dynamic_scale as flax_dynamic_scale
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import runtime
from configs import mlp as mlp_config
from runtime import data
from runtime import loss_scale
from runtime import training
from runtime.workloads import mlp

pytestmark = pytest.mark.devices

STEPS = 40
# A first scale far too big for float16, and growth every 5 finite steps:
# the run backs off, grows and backs off again within 40 steps.
SETTINGS = dict(growth_interval=5, scale=2.0**24)


def _half_precision(loss_fn):
  """The MLP's loss computed in float16 from float32 parameters, as Flax's
  ImageNet example computes with dtype=float16."""

  def loss(params, batch):
    half = jax.tree_util.tree_map(lambda p: p.astype(jnp.float16), params)
    value, metrics = loss_fn(half, {
        **batch, 'x': batch['x'].astype(jnp.float16)
    })
    return value.astype(jnp.float32), metrics

  return loss


def _flax_run(config, task):
  """Flax's ImageNet train_step under pmap over 8 devices: DynamicScale's
  value_and_grad, the update kept only where the gradients are finite."""
  devices = jax.local_devices()
  optimizer = task.optimizer

  def train_step(params, opt_state, scale, batch):
    grad_fn = scale.value_and_grad(task.loss_fn,
                                   has_aux=True,
                                   axis_name='batch')
    scale, finite, (loss, _), grads = grad_fn(params, batch)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = functools.partial(jnp.where, finite)
    params = jax.tree_util.tree_map(keep, new_params, params)
    opt_state = jax.tree_util.tree_map(keep, new_opt_state, opt_state)
    return params, opt_state, scale, finite, lax.pmean(loss, 'batch')

  step = jax.pmap(train_step, axis_name='batch')
  replicate = lambda tree: jax.tree_util.tree_map(
      lambda x: np.stack([np.asarray(x)] * len(devices)), tree)
  params = replicate(task.params)
  opt_state = replicate(optimizer.init(task.params))
  scale = replicate(flax_dynamic_scale.DynamicScale(**SETTINGS))
  scales, skipped, losses = [], [], []
  for i in range(config.steps):
    ids = data.global_batch_ids(i, config.global_batch_size, len(task.data),
                                config.seed, config.data.shuffle)
    batch = jax.tree_util.tree_map(
        lambda x: x.reshape((len(devices), -1) + x.shape[1:]),
        data.read_batch(task.data, ids))
    params, opt_state, scale, finite, loss = step(params, opt_state, scale,
                                                  batch)
    scales.append(float(scale.scale[0]))
    skipped.append(not bool(finite[0]))
    losses.append(float(loss[0]))
  return jax.device_get(jax.tree_util.tree_map(lambda x: x[0],
                                               params)), (scales, skipped,
                                                          losses)


@pytest.mark.parametrize('parallelism', ['pmap', 'shard_map'])
def test_the_loss_scale_equals_flax_s_step_for_step(tmp_path, parallelism):
  config = mlp_config.get_config()
  config.steps, config.log_every = STEPS, 1
  config.parallelism = parallelism
  plain, _ = mlp.make_task(config)
  task = dataclasses.replace(plain,
                             loss_fn=_half_precision(plain.loss_fn),
                             optimizer=optax.sgd(0.05, momentum=0.9),
                             loss_scale=runtime.DynamicScale(**SETTINGS))
  result = training.train(config, str(tmp_path), task)
  flax_params, (scales, skipped, losses) = _flax_run(config, task)

  rows = [
      json.loads(line)
      for line in open(tmp_path / 'metrics.jsonl')
      if '"loss_scale"' in line
  ]
  assert [r['step'] for r in rows] == list(range(1, STEPS + 1))
  assert [r['loss_scale'] for r in rows] == scales
  assert [bool(r['loss_scale_skipped']) for r in rows] == skipped
  # It did back off, grow and back off again.
  assert 3 <= sum(skipped) < STEPS // 2, skipped
  assert max(scales[sum(skipped[:5]):]) > min(scales), scales
  jax.tree_util.tree_map(np.testing.assert_array_equal, result.params,
                         flax_params)
  for row, loss in zip(rows, losses):
    if not row['loss_scale_skipped']:
      np.testing.assert_allclose(row['loss'], loss, rtol=1e-6)


def test_a_skipped_step_changes_nothing_and_a_non_finite_loss_stops_nothing(
    tmp_path):
  config = mlp_config.get_config()
  config.steps = 6
  plain, _ = mlp.make_task(config)

  calls = []
  source = plain.data

  class Poisoned:

    def __len__(self):
      return len(source)

    def __getitem__(self, i):
      return source[i]

    def read_batch(self, ids):
      calls.append(1)
      batch = source.read_batch(ids)
      if len(calls) == 3:  # Step 3's batch.
        batch['x'] = np.full_like(batch['x'], np.nan)
      return batch

  task = dataclasses.replace(plain,
                             data=Poisoned(),
                             loss_scale=runtime.DynamicScale())
  config.log_every = 1
  result = training.train(config, str(tmp_path), task)
  rows = [
      json.loads(line)
      for line in open(tmp_path / 'metrics.jsonl')
      if '"loss_scale"' in line
  ]
  assert [r['loss_scale_skipped'] for r in rows] == [0, 0, 1, 0, 0, 0]
  assert [r['loss_scale'] for r in rows] == [65536.0] * 2 + [32768.0] * 4
  assert rows[2]['loss'] == 'nan'  # Written as repr(nan).
  assert result.steps == 6
  # Without the scale, the same NaN stops the job at step 3 (exit 1).
  calls.clear()
  with pytest.raises(training.NonFiniteLossError,
                     match=r'nan at step 3; stopping \(exit 1\).*'
                     r'Task\(loss_scale=runtime.DynamicScale\(\)\)'):
    training.train(config, str(tmp_path / 'plain'),
                   dataclasses.replace(task, loss_scale=None))


def test_the_scale_is_checkpointed_and_resumed(tmp_path):
  config = mlp_config.get_config()
  config.steps, config.checkpoint_every = 12, 6
  plain, _ = mlp.make_task(config)
  task = dataclasses.replace(plain,
                             loss_fn=_half_precision(plain.loss_fn),
                             loss_scale=runtime.DynamicScale(**SETTINGS))
  straight = training.train(config, str(tmp_path / 'straight'), task)
  config.steps = 6
  training.train(config, str(tmp_path / 'resumed'), task)
  config.steps = 12
  resumed = training.train(config, str(tmp_path / 'resumed'), task)
  assert resumed.start_step == 6
  assert resumed.fingerprint == straight.fingerprint


def test_the_wrapper_alone_skips_and_backs_off():
  optimizer = loss_scale.wrap(
      optax.sgd(1.0), loss_scale.DynamicScale(growth_interval=2, scale=8.0))
  params = {'w': jnp.ones(2)}
  state = optimizer.init(params)
  seen = []
  for grad in ([1.0, 1.0], [1.0, jnp.inf], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]):
    updates, state = optimizer.update({'w': jnp.asarray(grad)}, state, params)
    seen.append((float(state.scale), int(state.fin_steps), bool(state.finite),
                 updates['w'].tolist()))
  assert seen == [(8.0, 1, True, [-1.0, -1.0]), (4.0, 0, False, [0.0, 0.0]),
                  (4.0, 1, True, [-1.0, -1.0]), (4.0, 2, True, [-1.0, -1.0]),
                  (8.0, 0, True, [-1.0, -1.0])]
