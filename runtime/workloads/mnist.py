"""MNIST digits, an MLP classifier trained data-parallel with Adam.

Reads the four standard IDX files (gzipped or not) from `config.data_dir`, a
local directory or a gs:// bucket that every host reads; nothing is
downloaded at run time (`podrun-fetch-mnist` fetches them, to either).
Evaluates on the whole test split every `config.eval_every` steps and at the
end, exactly: every test example once (runtime/evaluation.py).
"""

import os
from typing import Any

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict
import numpy as np
import optax

import runtime
from runtime.workloads import idx

FILES = {
    'train_images': 'train-images-idx3-ubyte',
    'train_labels': 'train-labels-idx1-ubyte',
    'test_images': 't10k-images-idx3-ubyte',
    'test_labels': 't10k-labels-idx1-ubyte',
}
NUM_CLASSES = 10


def _find(data_dir: str, name: str) -> str:
  for candidate in (name, name + '.gz'):
    path = _join(data_dir, candidate)
    if idx.exists(path):
      return path
  raise idx.IdxError(
      f'{_join(data_dir, name)}[.gz]: no such file. Put the MNIST IDX '
      f'files in config.data_dir={data_dir!r}, for example with '
      f'`podrun-fetch-mnist --data_dir={data_dir}`.')


def _join(data_dir: str, name: str) -> str:
  """A file of `data_dir`, a local directory or gs://BUCKET/PREFIX."""
  if data_dir.startswith('gs://'):
    return data_dir.rstrip('/') + '/' + name
  return os.path.join(data_dir, name)


def _split(data_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  images_path = _find(data_dir, FILES[f'{split}_images'])
  labels_path = _find(data_dir, FILES[f'{split}_labels'])
  images, labels = idx.read(images_path), idx.read(labels_path)
  if images.ndim != 3 or images.dtype != np.uint8:
    raise idx.IdxError(f'{images_path}: expected uint8 images (n, rows, '
                       f'cols), found {images.dtype} {images.shape}')
  if labels.ndim != 1 or labels.dtype != np.uint8:
    raise idx.IdxError(f'{labels_path}: expected uint8 labels (n,), found '
                       f'{labels.dtype} {labels.shape}')
  if len(images) != len(labels):
    raise idx.IdxError(f'{images_path} holds {len(images)} images but '
                       f'{labels_path} holds {len(labels)} labels')
  if labels.size and labels.max() >= NUM_CLASSES:
    raise idx.IdxError(f'{labels_path}: label {labels.max()} is not a digit')
  return images, labels


def load(data_dir: str) -> dict[str, np.ndarray]:
  """The four arrays: train/test images (n, rows * cols) float32 in [0, 1]
  and labels (n,) int32.

  Raises:
    IdxError: naming the file that is missing or malformed.
  """
  out = {}
  for split in ('train', 'test'):
    images, labels = _split(data_dir, split)
    out[f'{split}_images'] = (
        images.reshape(len(images), -1).astype(np.float32) / 255.0)
    out[f'{split}_labels'] = labels.astype(np.int32)
  return out


def write_synthetic(data_dir: str,
                    num_train: int = 60000,
                    num_test: int = 10000,
                    seed: int = 0,
                    gzipped: bool = True,
                    noise: float = 90.0) -> dict[str, np.ndarray]:
  """Writes learnable stand-ins for the four MNIST files into data_dir.

  For tests and benchmarks on machines without the real files. Each class is
  a fixed random 28 x 28 prototype; an example is its class's prototype plus
  Gaussian noise, clipped to bytes. A linear model separates the classes, so
  a short run lands far above chance (0.1).

  Returns:
    The arrays written: {train,test}_images (n, 28, 28) uint8 and
    {train,test}_labels (n,) uint8.
  """
  rng = np.random.default_rng(seed)
  prototypes = rng.uniform(0, 255, size=(NUM_CLASSES, 28, 28))
  arrays = {}
  for split, n in (('train', num_train), ('test', num_test)):
    labels = rng.integers(0, NUM_CLASSES, size=n).astype(np.uint8)
    images = prototypes[labels] + rng.normal(0, noise, size=(n, 28, 28))
    arrays[f'{split}_images'] = np.clip(images, 0, 255).astype(np.uint8)
    arrays[f'{split}_labels'] = labels
  os.makedirs(data_dir, exist_ok=True)
  suffix = '.gz' if gzipped else ''
  for key, array in arrays.items():
    idx.write(os.path.join(data_dir, FILES[key] + suffix), array)
  return arrays


def init_params(config: ConfigDict, num_features: int) -> dict[str, Any]:
  """Glorot-scaled weights and zero biases: features -> hidden... -> 10."""
  rng = np.random.default_rng([config.seed, 1])
  sizes = (num_features, *config.model.hidden_sizes, NUM_CLASSES)
  return {
      f'layer_{i}': {
          'w': (rng.normal(size=(m, n)) * np.sqrt(2.0 / (m + n))).astype(
              np.float32),
          'b':
              np.zeros(n, np.float32),
      } for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:]))
  }


def logits_fn(params, images: jnp.ndarray) -> jnp.ndarray:
  """(n, features) -> (n, 10), ReLU between layers."""
  x = images
  layers = [params[f'layer_{i}'] for i in range(len(params))]
  for layer in layers[:-1]:
    x = jax.nn.relu(x @ layer['w'] + layer['b'])
  return x @ layers[-1]['w'] + layers[-1]['b']


def loss_fn(params, batch) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
  """Mean cross-entropy and accuracy of one device's examples."""
  logits = logits_fn(params, batch['image'])
  loss = optax.softmax_cross_entropy_with_integer_labels(
      logits, batch['label']).mean()
  return loss, {'accuracy': jnp.mean(jnp.argmax(logits, -1) == batch['label'])}


def example_metrics(params, batch) -> dict[str, jnp.ndarray]:
  """Per-example loss and correctness, (n,) each, for evaluation."""
  logits = logits_fn(params, batch['image'])
  return {
      'loss':
          optax.softmax_cross_entropy_with_integer_labels(
              logits, batch['label']),
      'accuracy': (jnp.argmax(logits,
                              -1) == batch['label']).astype(jnp.float32),
  }


def sources(dataset: dict[str, np.ndarray]) -> dict[str, runtime.ArraySource]:
  """{'train': ..., 'test': ...}, each of examples {'image', 'label'}."""
  return {
      split:
          runtime.ArraySource(image=dataset[f'{split}_images'],
                              label=dataset[f'{split}_labels'])
      for split in ('train', 'test')
  }


def make_task(config: ConfigDict, dataset: dict[str,
                                                np.ndarray]) -> runtime.Task:
  split = sources(dataset)
  return runtime.Task(
      params=init_params(config, dataset['train_images'].shape[1]),
      loss_fn=loss_fn,
      optimizer=optax.adam(config.optimizer.learning_rate),
      data=split['train'],
      eval_fn=lambda params, _: runtime.evaluate(
          params, example_metrics, split['test'], config.eval_batch_size,
          runtime.parallelism.from_config(config),
          config.get('device_batch_limit')))


def train_and_evaluate(config: ConfigDict, workdir: str) -> runtime.TrainResult:
  """Trains on the train split; eval_* are the exact test-split metrics."""
  dataset = load(config.data_dir)
  return runtime.train(config, workdir, make_task(config, dataset))
