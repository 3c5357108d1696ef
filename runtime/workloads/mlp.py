"""A small MLP classifier on a synthetic, learnable data set.

Inputs are Gaussian (config.data.features,); labels are the argmax of a fixed
random linear "teacher", so the classes are learnable. The model is a
features -> hidden (tanh) -> classes MLP trained with softmax cross-entropy.
"""

from typing import Any

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict
import numpy as np
import optax

import runtime


def make_dataset(config: ConfigDict) -> dict[str, np.ndarray]:
  """{'x': (num_examples, features) float32, 'label': (num_examples,) int32}."""
  rng = np.random.default_rng(config.seed)
  features = config.data.features
  teacher = rng.normal(size=(features, config.data.num_classes))
  x = rng.normal(size=(config.data.num_examples, features)).astype(np.float32)
  return {'x': x, 'label': np.argmax(x @ teacher, axis=1).astype(np.int32)}


def init_params(config: ConfigDict) -> dict[str, Any]:
  """Glorot-scaled weights and zero biases, drawn from the seed."""
  rng = np.random.default_rng([config.seed, 1])
  sizes = (config.data.features, config.model.hidden, config.data.num_classes)
  return {
      f'layer_{i}': {
          'w': (rng.normal(size=(m, n)) / np.sqrt(
              (m + n) / 2)).astype(np.float32),
          'b':
              np.zeros(n, np.float32),
      } for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:]))
  }


def logits_fn(params, x: jnp.ndarray) -> jnp.ndarray:
  """(n, features) -> (n, classes)."""
  hidden = jnp.tanh(x @ params['layer_0']['w'] + params['layer_0']['b'])
  return hidden @ params['layer_1']['w'] + params['layer_1']['b']


def loss_fn(params, batch) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
  """Cross-entropy and accuracy of one device's examples."""
  logits = logits_fn(params, batch['x'])
  loss = optax.softmax_cross_entropy_with_integer_labels(
      logits, batch['label']).mean()
  accuracy = jnp.mean(jnp.argmax(logits, -1) == batch['label'])
  return loss, {'accuracy': accuracy}


def make_task(config: ConfigDict) -> tuple[runtime.Task, dict[str, np.ndarray]]:
  dataset = make_dataset(config)
  task = runtime.Task(params=init_params(config),
                      loss_fn=loss_fn,
                      optimizer=optax.adam(config.optimizer.learning_rate),
                      data=runtime.ArraySource(x=dataset['x'],
                                               label=dataset['label']))
  return task, dataset


def train_and_evaluate(config: ConfigDict, workdir: str) -> runtime.TrainResult:
  """Trains the MLP; adds its accuracy on the whole data set."""
  task, dataset = make_task(config)
  result = runtime.train(config, workdir, task)
  logits = jax.jit(logits_fn)(result.params, dataset['x'])
  accuracy = float(np.mean(np.argmax(logits, -1) == dataset['label']))
  result.extra = {'train_accuracy': accuracy}
  return result
