"""Linear regression y = x . w + b, trained data-parallel with SGD.

The data are drawn once from `config.seed`: true weights (config.data.features,)
and a scalar true bias, inputs x ~ N(0, 1) and targets with Gaussian noise of
standard deviation `config.data.noise_std`. They do not depend on how many
processes or devices train, so every topology learns the same model.
"""

import jax.numpy as jnp
from ml_collections import ConfigDict
import numpy as np
import optax

import runtime


def make_dataset(config: ConfigDict) -> dict[str, np.ndarray]:
  """The whole data set and the truth it was drawn from.

  Returns:
    {'x': (num_examples, features) float32, 'y': (num_examples,) float32,
     'true_weight': (features,) float32, 'true_bias': () float32}.
  """
  rng = np.random.default_rng(config.seed)
  features, n = config.data.features, config.data.num_examples
  true_weight = rng.normal(size=features).astype(np.float32)
  true_bias = np.float32(rng.normal())
  x = rng.normal(size=(n, features)).astype(np.float32)
  noise = config.data.noise_std * rng.normal(size=n)
  y = (x @ true_weight + true_bias + noise).astype(np.float32)
  return {'x': x, 'y': y, 'true_weight': true_weight, 'true_bias': true_bias}


def init_params(config: ConfigDict) -> dict[str, np.ndarray]:
  """{'weight': (features,), 'bias': ()} float32, drawn from the seed."""
  rng = np.random.default_rng([config.seed, 1])
  return {
      'weight': rng.normal(size=config.data.features).astype(np.float32),
      'bias': np.float32(0.0)
  }


def loss_fn(params, batch) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
  """Mean squared error of one device's examples: x (n, f), y (n,)."""
  prediction = batch['x'] @ params['weight'] + params['bias']
  return jnp.mean((prediction - batch['y'])**2), {}


def make_task(config: ConfigDict) -> tuple[runtime.Task, dict[str, np.ndarray]]:
  """The training task and the data set behind it."""
  dataset = make_dataset(config)
  task = runtime.Task(params=init_params(config),
                      loss_fn=loss_fn,
                      optimizer=optax.sgd(config.optimizer.learning_rate),
                      data=runtime.ArraySource(x=dataset['x'], y=dataset['y']))
  return task, dataset


def train_and_evaluate(config: ConfigDict, workdir: str) -> runtime.TrainResult:
  """Trains the model; adds the learned and the true parameters."""
  task, dataset = make_task(config)
  result = runtime.train(config, workdir, task)
  learned = result.params
  error = max(
      np.abs(learned['weight'] - dataset['true_weight']).max(),
      abs(float(learned['bias']) - float(dataset['true_bias'])))
  result.extra = {
      'learned_weight': learned['weight'],
      'learned_bias': learned['bias'],
      'true_weight': dataset['true_weight'],
      'true_bias': dataset['true_bias'],
      'max_abs_error': float(error),
  }
  return result
