"""Small, learnable MNIST-format IDX files for tests.

Each class is a fixed random 28 x 28 prototype; an example is its class's
prototype plus noise, clipped to bytes. A linear model separates the classes,
so a short training run lands far above chance (0.1).
"""

import os

import numpy as np

from runtime import idx
from runtime.workloads import mnist


def write(data_dir, num_train=4096, num_test=10001, seed=0, gzipped=True,
          noise=90.0):
  """Writes the four files into data_dir; returns the arrays written."""
  rng = np.random.default_rng(seed)
  prototypes = rng.uniform(0, 255, size=(mnist.NUM_CLASSES, 28, 28))
  arrays = {}
  for split, n in (('train', num_train), ('test', num_test)):
    labels = rng.integers(0, mnist.NUM_CLASSES, size=n).astype(np.uint8)
    images = prototypes[labels] + rng.normal(0, noise, size=(n, 28, 28))
    arrays[f'{split}_images'] = np.clip(images, 0, 255).astype(np.uint8)
    arrays[f'{split}_labels'] = labels
  suffix = '.gz' if gzipped else ''
  for key, array in arrays.items():
    idx.write(os.path.join(data_dir, mnist.FILES[key] + suffix), array)
  return arrays
