"""Exact evaluation: every example once, padded and masked, sample-weighted."""

import jax
import numpy as np
import pytest

from configs import mnist as mnist_config
from runtime import evaluation
from runtime import parallelism
from runtime.workloads import mnist

pytestmark = pytest.mark.devices


@pytest.mark.parametrize('process_count,devices', [(1, 8), (2, 8), (4, 8),
                                                   (3, 6), (6, 48), (5, 5)])
def test_eval_batches_cover_every_example_once(process_count, devices):
  # 512 divides over 8 devices; over 6, 48 and 5 the rows are padded.
  layout = evaluation.plan(512, devices)
  assert layout.rows % devices == 0 and 0 <= layout.rows - 512 < devices
  seen = []
  steps = []
  for p in range(process_count):
    batches = list(evaluation.eval_batches(10001, layout, p, process_count))
    steps.append(len(batches))
    for ids, mask in batches:
      assert len(ids) == layout.rows // process_count
      seen.extend(ids[mask > 0].tolist())
  assert steps == [evaluation.num_eval_steps(10001, layout)] * process_count
  assert steps == [20] * process_count
  assert sorted(seen) == list(range(10001))


def test_a_device_batch_limit_takes_fewer_examples_per_eval_step():
  assert evaluation.plan(1024, 48) == evaluation.EvalLayout(1024, 1056)
  assert evaluation.plan(1024, 8,
                         device_batch_limit=64) == (evaluation.EvalLayout(
                             512, 512))
  assert evaluation.plan(1024, 6,
                         device_batch_limit=100) == (evaluation.EvalLayout(
                             600, 600))
  with pytest.raises(parallelism.BatchSizeError, match='eval_batch_size'):
    evaluation.plan(0, 8)


def _numpy_logits(params, images):
  x = images
  for i in range(len(params) - 1):
    layer = params[f'layer_{i}']
    x = np.maximum(x @ layer['w'] + layer['b'], 0)
  last = params[f'layer_{len(params) - 1}']
  return x @ last['w'] + last['b']


@pytest.mark.parametrize('eval_batch_size', [512, 1001])
def test_10001_examples_match_a_numpy_reference(tmp_path, eval_batch_size):
  # 1001 does not divide over the 8 devices: each eval step is padded.
  assert jax.device_count() == 8
  mnist.write_synthetic(str(tmp_path), num_train=16, num_test=10001)
  data = mnist.load(str(tmp_path))
  config = mnist_config.get_config()
  config.model.hidden_sizes = (32,)
  params = mnist.init_params(config, 784)
  result = evaluation.evaluate(parallelism.PMAP.replicate(params),
                               mnist.example_metrics,
                               mnist.sources(data)['test'], eval_batch_size,
                               parallelism.PMAP)
  logits = _numpy_logits(params, data['test_images'].astype(np.float64))
  labels = data['test_labels']
  accuracy = np.mean(np.argmax(logits, -1) == labels)
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  loss = -np.mean(log_probs[np.arange(len(labels)), labels])
  assert result['num_examples'] == 10001
  assert result['accuracy'] == pytest.approx(accuracy, abs=0.5 / 10001)
  assert result['loss'] == pytest.approx(loss, rel=1e-5)


def test_mnist_learns_generated_digits(tmp_path):
  mnist.write_synthetic(str(tmp_path / 'data'), num_train=4096, num_test=1001)
  config = mnist_config.get_config()
  config.data_dir = str(tmp_path / 'data')
  config.model.hidden_sizes = (64,)
  config.steps = 60
  config.eval_every = 30
  config.log_every = 10
  result = mnist.train_and_evaluate(config, str(tmp_path / 'work'))
  assert result.eval_metrics['eval_num_examples'] == 1001
  # Chance is 0.1.
  assert result.eval_metrics['eval_accuracy'] > 0.9, result.eval_metrics


def _small_mnist(tmp_path, num_test: int):
  """(replicated parameters of a small MLP, a test split of num_test)."""
  mnist.write_synthetic(str(tmp_path), num_train=16, num_test=num_test)
  data = mnist.load(str(tmp_path))
  config = mnist_config.get_config()
  config.model.hidden_sizes = (8,)
  params = parallelism.PMAP.replicate(mnist.init_params(config, 784))
  return params, mnist.sources(data)['test']


def test_a_metric_that_is_a_mean_is_refused_naming_it(tmp_path):
  # 1001 examples in batches of 80: a mean per batch would be weighted by
  # batches and count the padding; only per-example values are exact.
  params, test = _small_mnist(tmp_path, num_test=1001)

  def means(params_, batch):
    per_example = mnist.example_metrics(params_, batch)
    return {
        'accuracy': per_example['accuracy'],
        'loss': per_example['loss'].mean()
    }

  with pytest.raises(evaluation.MetricShapeError,
                     match=r"'loss' has shape \(\); .* shape \(10,\)"):
    evaluation.evaluate(params, means, test, 80, parallelism.PMAP)


def test_the_check_before_training_traces_and_runs_nothing(tmp_path):
  params, test = _small_mnist(tmp_path, num_test=101)
  seen = []

  def eval_fn(params_, _):
    values = evaluation.evaluate(params_, mnist.example_metrics, test, 80,
                                 parallelism.PMAP)
    seen.append(values)
    assert values['accuracy'] > 0.5  # eval_fn's own test of the values
    return values

  # In the check the values are nan, so eval_fn's own assertion fails: that
  # is left to the real evaluation, and the check passes.
  evaluation.check_eval_fn(eval_fn, params, None)
  assert sorted(seen[0]) == ['accuracy', 'loss', 'num_examples']
  assert np.isnan(seen[0]['loss']) and seen[0]['num_examples'] == 101

  def means(params_, _):
    return evaluation.evaluate(
        params_,
        lambda p, b: {'loss': mnist.example_metrics(p, b)['loss'].mean()}, test,
        80, parallelism.PMAP)

  with pytest.raises(evaluation.MetricShapeError, match=r"'loss' has shape"):
    evaluation.check_eval_fn(means, params, None)
  # Outside the check, evaluate runs for real.
  assert not np.isnan(
      evaluation.evaluate(params, mnist.example_metrics, test, 80,
                          parallelism.PMAP)['loss'])
