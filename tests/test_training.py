"""Data-parallel training on 8 devices equals full-batch descent on one."""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import linear_regression as linear_regression_config
from configs import mlp as mlp_config
import runtime
from runtime import data
from runtime import fingerprint
from runtime import training
from runtime.common import exit_codes
from runtime.workloads import linear_regression
from runtime.workloads import mlp
from tests.reference import single_device_descent

pytestmark = pytest.mark.devices


def assert_trees_close(a, b, rtol, atol):
  jax.tree_util.tree_map(
      lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def test_linear_regression_on_8_devices_equals_one_device(tmp_path):
  assert jax.device_count() == 8
  config = linear_regression_config.get_config()
  config.steps = 40
  task, dataset = linear_regression.make_task(config)
  result = training.train(config, str(tmp_path), task)
  assert_trees_close(result.params,
                     single_device_descent(config, task),
                     rtol=1e-5,
                     atol=1e-6)
  assert np.abs(result.params['weight'] - dataset['true_weight']).max() < 0.05


def test_mlp_on_8_devices_equals_one_device(tmp_path):
  assert jax.device_count() == 8
  config = mlp_config.get_config()
  config.steps = 25
  task, _ = mlp.make_task(config)
  result = training.train(config, str(tmp_path), task)
  assert_trees_close(result.params,
                     single_device_descent(config, task),
                     rtol=2e-4,
                     atol=2e-5)


def test_steps_in_flight_do_not_change_the_result(tmp_path):
  config = linear_regression_config.get_config()
  config.steps = 12
  task, _ = linear_regression.make_task(config)
  one = training.train(config, str(tmp_path / 'one'), task)
  config.max_steps_in_flight = 3
  three = training.train(config, str(tmp_path / 'three'), task)
  assert one.fingerprint == three.fingerprint


def test_metrics_and_rank_files(tmp_path):
  config = linear_regression_config.get_config()
  config.steps = 30
  config.log_every = 10
  task, _ = linear_regression.make_task(config)
  result = training.train(config, str(tmp_path), task)
  with open(tmp_path / 'metrics.jsonl') as f:
    records = [json.loads(line) for line in f]
  assert [r['step'] for r in records] == [10, 20, 30]
  for r in records:
    assert {'loss', 'steps_per_sec', 'examples_per_sec'} <= set(r)
    assert r['examples_per_sec'] == pytest.approx(r['steps_per_sec'] * 256)
  with open(tmp_path / 'ranks' / 'rank_0.json') as f:
    rank = json.load(f)
  assert rank['process_index'] == 0 and len(rank['local_devices']) == 8
  assert rank['fingerprint'] == fingerprint.fingerprint(result.params)


def test_non_finite_loss_names_the_step(tmp_path):
  config = linear_regression_config.get_config()
  config.steps = 10
  task, _ = linear_regression.make_task(config)
  calls = []

  def poisoned(ids):
    calls.append(1)
    batch = task.data.read_batch(ids)
    if len(calls) == 5:  # The batch of step 5.
      batch['y'] = np.full_like(batch['y'], np.nan)
    return batch

  source = data.ArraySource(**task.data.arrays)
  source.read_batch = poisoned
  bad = dataclasses.replace(task, data=source)
  with pytest.raises(training.NonFiniteLossError, match='nan at step 5;'):
    training.train(config, str(tmp_path), bad)


def test_a_non_finite_loss_inside_a_call_names_its_step(tmp_path):
  # Four steps a call: the call of steps 5-8 holds it; steps 1-6 count.
  config = linear_regression_config.get_config()
  config.steps, config.steps_per_dispatch, config.log_every = 12, 4, 4
  task, _ = linear_regression.make_task(config)
  # One example of step 7 (a call reads its four steps at once).
  poisoned = data.steps_batch_ids(6, 1, config.global_batch_size,
                                  len(task.data), config.seed,
                                  config.data.shuffle)[0, 0]
  arrays = {k: np.array(v) for k, v in task.data.arrays.items()}
  arrays['y'][poisoned] = np.nan
  bad = dataclasses.replace(task, data=data.ArraySource(**arrays))
  with pytest.raises(training.NonFiniteLossError, match='nan at step 7;'):
    training.train(config, str(tmp_path), bad)
  with open(tmp_path / 'metrics.jsonl') as f:
    assert [json.loads(line)['step'] for line in f] == [4]


def test_a_batch_that_does_not_divide_equals_one_device(tmp_path):
  # 100 examples over 8 devices: 5 groups of 20 and 3 of padding, whose
  # zero rows would make the loss NaN if they reached it.
  config = linear_regression_config.get_config()
  config.global_batch_size = 100
  config.steps = 30
  task, _ = linear_regression.make_task(config)

  def poisoned(params, batch):
    loss, metrics = linear_regression.loss_fn(params, batch)
    padded = jnp.any(jnp.all(batch['x'] == 0, axis=-1))
    return jnp.where(padded, jnp.nan, loss), metrics

  result = training.train(config, str(tmp_path),
                          dataclasses.replace(task, loss_fn=poisoned))
  assert_trees_close(result.params,
                     single_device_descent(config, task),
                     rtol=1e-5,
                     atol=1e-6)
  assert result.topology == {
      'num_processes': 1,
      'num_devices': 8,
      'microbatches': 1
  }
  with open(tmp_path / 'metrics.jsonl') as f:
    rows = [json.loads(line) for line in f]
  assert all(r['num_devices'] == 8 and r['microbatches'] == 1 for r in rows)


@pytest.mark.parametrize('parallelism', ['pmap', 'shard_map'])
def test_microbatches_give_the_step_of_one_pass(tmp_path, parallelism):
  config = mlp_config.get_config()
  config.steps = 25
  config.parallelism = parallelism
  task, _ = mlp.make_task(config)
  results = {}
  for k in (1, 2, 4):
    config.microbatches = k
    results[k] = training.train(config, str(tmp_path / str(k)), task)
    assert results[k].topology['microbatches'] == k
  for k in (2, 4):
    assert_trees_close(results[k].params,
                       results[1].params,
                       rtol=2e-5,
                       atol=2e-6)
  assert_trees_close(results[1].params,
                     single_device_descent(config, task),
                     rtol=2e-4,
                     atol=2e-5)


def test_dropout_gives_the_same_step_in_any_microbatches(tmp_path):
  """Dropout's mask is drawn per example from its global position: groups
  of 64, 32, 16 and 8 examples drop the same values."""
  config = mlp_config.get_config()
  config.steps = 12
  config.data.shuffle = False  # So that the seed reaches only the key.
  plain, _ = mlp.make_task(config)

  def dropped(params, batch, rng):
    return plain.loss_fn(params, {
        **batch, 'x': runtime.dropout(rng, 0.3, batch['x'])
    })

  task = dataclasses.replace(plain, loss_fn=dropped, rng='example')
  results = {}
  for k in (1, 2, 4):
    config.microbatches = k
    results[k] = training.train(config, str(tmp_path / str(k)), task)
  config.microbatches, config.microbatch_size = 0, 8
  results['fixed'] = training.train(config, str(tmp_path / 'fixed'), task)
  assert results['fixed'].topology['microbatches'] == 8
  for k in (2, 4, 'fixed'):
    assert_trees_close(results[k].params,
                       results[1].params,
                       rtol=2e-5,
                       atol=2e-6)
  # And the masks do matter: another step key, other parameters.
  config.seed, config.microbatch_size = 1, 0
  other = training.train(config, str(tmp_path / 'seed1'), task)
  assert other.fingerprint != results[1].fingerprint


def test_a_device_batch_limit_accumulates_as_many_microbatches(tmp_path):
  config = mlp_config.get_config()  # 512 examples: 64 per device.
  config.steps = 3
  config.device_batch_limit = 20
  task, _ = mlp.make_task(config)
  result = training.train(config, str(tmp_path), task)
  assert result.topology['microbatches'] == 4  # Groups of 16.


@pytest.mark.parametrize('parallelism', ['pmap', 'shard_map'])
def test_the_models_collectives_run_under_the_users_axis_name(
    tmp_path, parallelism):
  # A model normalising over the global batch with its own collective, as
  # Flax's nn.BatchNorm(axis_name='batch') does: under config.axis_name the
  # step is the one it is under podrun's name, to the bit.
  config = linear_regression_config.get_config()
  config.steps, config.parallelism = 4, parallelism
  task, _ = linear_regression.make_task(config)

  def normalised(axis):

    def loss_fn(params, batch):
      x = batch['x'] - jax.lax.pmean(batch['x'].mean(0), axis)
      return linear_regression.loss_fn(params, {**batch, 'x': x})

    return dataclasses.replace(task, loss_fn=loss_fn)

  ours = training.train(config, str(tmp_path / 'devices'),
                        normalised('devices'))
  config.axis_name = 'batch'
  flax = training.train(config, str(tmp_path / 'batch'), normalised('batch'))
  assert flax.fingerprint == ours.fingerprint
  # Evaluation's collectives follow the name too.
  par = runtime.parallelism.from_config(config)
  assert par.axis == 'batch' and repr(par) == (
      f"{parallelism} over the axis 'batch'")
  values = runtime.evaluate(par.replicate(flax.params),
                            lambda p, b: {'y2': b['y']**2}, task.data, 64, par)
  ys = np.asarray([task.data[i]['y'] for i in range(len(task.data))])
  assert values['num_examples'] == len(task.data)
  np.testing.assert_allclose(values['y2'], (ys**2).mean(), rtol=1e-5)


def test_an_axis_name_that_is_not_a_name_is_refused():
  config = linear_regression_config.get_config()
  config.axis_name = 'two words'
  with pytest.raises(ValueError, match="config.axis_name='two words'"):
    runtime.parallelism.from_config(config)


@pytest.mark.parametrize(
    'returned, said',
    [
        (lambda loss, batch: loss, 'loss_fn returned an array of shape (); it '
         'must return (loss, metrics)'),
        (lambda loss, batch:
         (loss, {}, {}), 'loss_fn returned a tuple of 3; it '
         'must return (loss, metrics)'),
        (lambda loss, batch:
         (loss * jnp.ones(2), {}), 'loss_fn returned a loss '
         'of shape (2,); it must return (loss, metrics)'),
        # Flax's examples: (loss, logits).
        (lambda loss, batch: (loss, batch['x'] * 2.0),
         "loss_fn returned (loss, an array of shape (32, 3)) where (loss, "
         "metrics) needs a dict of scalar metrics ({} for none). Flax's "
         "examples return (loss, logits): compute the metrics from the logits "
         "inside loss_fn"),
        # A per-example value among the metrics.
        (lambda loss, batch: (loss, {
            'error': batch['y'] - 1.0
        }), "loss_fn's metric 'error' has shape (32,); metrics must be scalars"
        ),
        # Flax's ImageNet idiom, nn.BatchNorm(axis_name='batch').
        (lambda loss, batch: (jax.lax.pmean(loss, 'batch'), {}),
         "loss_fn uses the axis name 'batch' (a collective such as "
         "lax.pmean(x, 'batch'), or Flax's nn.BatchNorm(axis_name='batch')), "
         "which the step does not bind: podrun maps the step over the devices "
         "on the axis 'devices'. Either set config.axis_name='batch'"),
    ])
def test_a_loss_fn_of_another_output_is_refused_before_step_1(
    tmp_path, returned, said):
  config = linear_regression_config.get_config()
  config.steps = 3
  task, _ = linear_regression.make_task(config)

  def loss_fn(params, batch):
    loss, _ = linear_regression.loss_fn(params, batch)
    return returned(loss, batch)

  with pytest.raises(exit_codes.ConfigError, match=re.escape(said)):
    training.train(config, str(tmp_path),
                   dataclasses.replace(task, loss_fn=loss_fn))
  # Refused while the step compiled: nothing was trained or written.
  assert not (tmp_path / 'metrics.jsonl').exists() or not (
      tmp_path / 'metrics.jsonl').read_text()


def test_a_metric_named_loss_is_refused_unless_it_is_the_loss(tmp_path):
  # Flax's ImageNet example: metrics['loss'] is the cross-entropy, the loss
  # returned adds weight decay; one would silently replace the other.
  config = linear_regression_config.get_config()
  config.steps = 2
  task, _ = linear_regression.make_task(config)

  def decayed(params, batch):
    loss, metrics = linear_regression.loss_fn(params, batch)
    return loss + 0.1 * jnp.sum(params['weight']**2), {**metrics, 'loss': loss}

  with pytest.raises(
      exit_codes.ConfigError,
      match=re.escape(
          "loss_fn's metrics hold 'loss', a value other than the loss it "
          "returns")):
    training.train(config, str(tmp_path / 'a'),
                   dataclasses.replace(task, loss_fn=decayed))

  def same(params, batch):  # The loss itself under its name is fine.
    loss, metrics = linear_regression.loss_fn(params, batch)
    return loss, {**metrics, 'loss': loss}

  plain = training.train(config, str(tmp_path / 'b'), task)
  named = training.train(config, str(tmp_path / 'c'),
                         dataclasses.replace(task, loss_fn=same))
  assert named.fingerprint == plain.fingerprint
  assert named.final_metrics['loss'] == plain.final_metrics['loss']


def test_a_metrics_prefix_names_the_step_s_metrics_as_flax_s_writer(tmp_path):
  config = linear_regression_config.get_config()
  config.steps, config.log_every = 4, 2
  config.metrics_prefix = 'train_'
  task, _ = linear_regression.make_task(config)
  task = dataclasses.replace(task, schedule=lambda count: 0.1)
  training.train(config, str(tmp_path), task)
  with open(tmp_path / 'metrics.jsonl') as f:
    rows = [json.loads(line) for line in f]
  assert [r['step'] for r in rows] == [2, 4]
  assert {'train_loss', 'train_learning_rate', 'steps_per_sec'} <= set(rows[0])
  assert 'loss' not in rows[0] and 'learning_rate' not in rows[0]
