"""The Flax CNN example: the MLP's proofs, with batch statistics and dropout."""

import jax
import numpy as np
import pytest

from configs import mnist_cnn as mnist_cnn_config
from runtime import training
from runtime.workloads import mnist
from runtime.workloads import mnist_cnn
from tests import helpers

pytestmark = pytest.mark.devices


def _config(data_dir, steps, **fields):
  config = mnist_cnn_config.get_config()
  config.data_dir = str(data_dir)
  config.model.features, config.model.dense = (4, 8), 16
  config.optimizer.warmup_steps, config.optimizer.decay_steps = 3, 20
  config.steps, config.log_every, config.eval_batch_size = steps, 1, 128
  config.eval_every, config.checkpoint_every = 4, 4
  config.update(fields)
  return config


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp('mnist')
  mnist.write_synthetic(str(path), num_train=1024, num_test=1001)
  return path


def _assert_same(a: training.TrainResult, b: training.TrainResult) -> None:
  assert a.fingerprint == b.fingerprint
  jax.tree_util.tree_map(np.testing.assert_array_equal, a.model_state,
                         b.model_state)
  assert a.eval_metrics == b.eval_metrics


def test_batch_statistics_are_trained_and_evaluated(data_dir, tmp_path):
  assert jax.device_count() == 8
  config = _config(data_dir, 6)
  before = mnist_cnn.make_task(config, mnist.load(str(data_dir))).model_state
  result = mnist_cnn.train_and_evaluate(config, str(tmp_path))
  means = [
      leaf
      for path, leaf in jax.tree_util.tree_leaves_with_path(result.model_state)
      if 'mean' in jax.tree_util.keystr(path)
  ]
  assert means and all(np.abs(m).max() > 0 for m in means)
  assert not all(
      np.array_equal(a, b)
      for a, b in zip(jax.tree_util.tree_leaves(before),
                      jax.tree_util.tree_leaves(result.model_state)))
  assert result.eval_metrics['eval_num_examples'] == 1001
  records = helpers.read_jsonl(tmp_path / 'metrics.jsonl')
  assert all('learning_rate' in r for r in records if 'loss' in r)


def test_resume_is_exact_with_batch_statistics_and_dropout(data_dir, tmp_path):
  straight = mnist_cnn.train_and_evaluate(_config(data_dir, 10),
                                          str(tmp_path / 'straight'))
  mnist_cnn.train_and_evaluate(_config(data_dir, 6), str(tmp_path / 'cut'))
  resumed = mnist_cnn.train_and_evaluate(_config(data_dir, 10),
                                         str(tmp_path / 'cut'))
  assert resumed.start_step == 6
  _assert_same(straight, resumed)
  losses = [[
      r['loss']
      for r in helpers.read_jsonl(tmp_path / k / 'metrics.jsonl')
      if 'loss' in r
  ]
            for k in ('straight', 'cut')]
  assert losses[0] == losses[1] and len(losses[0]) == 10


def test_dropout_draws_from_the_step_key(data_dir, tmp_path):
  """Another seed for the loop's key, the same initial model and the same
  batches (no shuffling, so the seed reaches only the key): other masks;
  and without dropout the seed changes nothing at all."""
  dataset = mnist.load(str(data_dir))

  def trained(name, seed, dropout):
    config = _config(data_dir, 3, checkpointing=False, seed=seed)
    config.data.shuffle = False
    config.model.dropout = dropout
    built = _config(data_dir, 3, seed=0)  # One initial model for all.
    built.model.dropout = dropout
    task = mnist_cnn.make_task(built, dataset)
    return training.train(config, str(tmp_path / name), task).fingerprint

  assert trained('a', 0, 0.3) != trained('b', 1, 0.3)
  assert trained('c', 0, 0.0) == trained('d', 1, 0.0)


def test_pmap_and_shard_map_agree(data_dir, tmp_path):
  results = [
      mnist_cnn.train_and_evaluate(
          _config(data_dir, 8, parallelism=kind, checkpointing=False),
          str(tmp_path / kind)) for kind in ('pmap', 'shard_map')
  ]
  _assert_same(*results)
