"""pmap and jit(shard_map) run the same step to the same parameters."""

import dataclasses

import jax
from jax import lax
import numpy as np
import pytest

from configs import linear_regression as linear_regression_config
from configs import mlp as mlp_config
from configs import mnist as mnist_config
import runtime
from runtime import parallelism
from runtime import training
from runtime.workloads import linear_regression
from runtime.workloads import mlp
from runtime.workloads import mnist
from tests import helpers

pytestmark = pytest.mark.devices


def test_unknown_parallelism_names_the_choices():
  with pytest.raises(ValueError, match="'pmap', 'shard_map'") as e:
    parallelism.named('pjit')
  assert "config.parallelism='pjit'" in str(e.value)


def test_batch_layouts():
  assert jax.device_count() == 8
  rows = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
  by_pmap = parallelism.PMAP.put_batch({'x': rows})['x']
  assert by_pmap.shape == (8, 8, 3)
  by_shard_map = parallelism.SHARD_MAP.put_batch({'x': rows})['x']
  assert by_shard_map.shape == (64, 3)
  assert len(by_shard_map.addressable_shards) == 8
  # Device i gets the same rows either way.
  for shard in by_shard_map.addressable_shards:
    position = parallelism.global_mesh().devices.tolist().index(shard.device)
    np.testing.assert_array_equal(np.asarray(shard.data),
                                  rows[position * 8:(position + 1) * 8])
    np.testing.assert_array_equal(np.asarray(by_pmap[position]),
                                  np.asarray(shard.data))


def test_shard_map_step_sees_per_device_shapes_and_spans_every_device():
  seen = {}

  def per_device(total, x):
    seen['x'] = x.shape
    return total + lax.psum(x.sum(), parallelism.DATA_AXIS)

  for par in parallelism.CHOICES:
    fn = par.map(per_device, in_axes=(None, 0), out_axes=None)
    out = fn(par.replicate(np.float32(1)),
             par.put_batch(np.ones((32, 2), np.float32)))
    assert seen['x'] == (4, 2)
    assert float(par.to_host(out)) == 65.0


def _train(config, workdir, task, kind):
  config = config.copy_and_resolve_references()
  config.parallelism = str(kind)
  return training.train(config, workdir, task)


@pytest.mark.parametrize('workload', ['linear_regression', 'mlp'])
def test_pmap_and_shard_map_agree_on_8_devices(tmp_path, workload):
  assert jax.device_count() == 8
  if workload == 'linear_regression':
    config = linear_regression_config.get_config()
    task, _ = linear_regression.make_task(config)
  else:
    config = mlp_config.get_config()
    task, _ = mlp.make_task(config)
  config.steps, config.log_every = 25, 1
  by_pmap = _train(config, str(tmp_path / 'pmap'), task, 'pmap')
  by_shard_map = _train(config, str(tmp_path / 'shard_map'), task, 'shard_map')
  assert by_shard_map.fingerprint == by_pmap.fingerprint
  losses = [[
      r['loss'] for r in helpers.read_jsonl(tmp_path / k / 'metrics.jsonl')
  ] for k in ('pmap', 'shard_map')]
  assert losses[0] == losses[1] and len(losses[0]) == 25


def test_per_device_rng_is_the_same_on_both_paths(tmp_path):
  config = mlp_config.get_config()
  config.steps = 10
  plain, _ = mlp.make_task(config)

  def noisy_loss(params, batch, rng):
    # Input dropout: the gradients, not only the loss, depend on the key.
    loss, metrics = plain.loss_fn(params, {
        **batch, 'x': runtime.dropout(rng, 0.2, batch['x'])
    })
    return loss, metrics

  task = dataclasses.replace(plain, loss_fn=noisy_loss, rng='example')
  results = [
      _train(config, str(tmp_path / str(k)), task, k)
      for k in parallelism.CHOICES
  ]
  assert results[0].fingerprint == results[1].fingerprint
  assert results[0].final_metrics == results[1].final_metrics


def test_mnist_with_exact_eval_agrees_on_both_paths(tmp_path):
  mnist.write_synthetic(str(tmp_path / 'data'), num_train=1024, num_test=1001)
  config = mnist_config.get_config()
  config.data_dir = str(tmp_path / 'data')
  config.model.hidden_sizes = (32,)
  config.steps, config.eval_every, config.eval_batch_size = 12, 6, 128
  dataset = mnist.load(config.data_dir)
  results = []
  for par in parallelism.CHOICES:
    config.parallelism = str(par)
    results.append(
        _train(config, str(tmp_path / str(par)),
               mnist.make_task(config, dataset), par))
  assert results[0].fingerprint == results[1].fingerprint
  assert results[0].eval_metrics == results[1].eval_metrics
  assert results[1].eval_metrics['eval_num_examples'] == 1001


def test_shard_map_resumes_a_pmap_checkpoint(tmp_path):
  config = mlp_config.get_config()
  config.steps = 14
  task, _ = mlp.make_task(config)
  straight = _train(config, str(tmp_path / 'straight'), task, 'pmap')
  config.steps = 7
  _train(config, str(tmp_path / 'switched'), task, 'pmap')
  config.steps = 14
  resumed = _train(config, str(tmp_path / 'switched'), task, 'shard_map')
  assert resumed.start_step == 7
  assert resumed.fingerprint == straight.fingerprint


def test_input_wait_is_a_logged_fraction(tmp_path):
  config = linear_regression_config.get_config()
  config.steps, config.log_every = 20, 5
  task, _ = linear_regression.make_task(config)
  _train(config, str(tmp_path), task, 'shard_map')
  records = helpers.read_jsonl(tmp_path / 'metrics.jsonl')
  assert [r['step'] for r in records] == [5, 10, 15, 20]
  # The first window holds the first step, which is left out of the timing.
  for r in records:
    assert 0.0 <= r['input_wait_fraction'] < 1.0
