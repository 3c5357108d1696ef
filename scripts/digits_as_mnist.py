"""Writes scikit-learn's bundled handwritten digits as MNIST IDX files.

  pip install -e .[digits]          # scikit-learn
  python scripts/digits_as_mnist.py --data_dir=data/digits

Real digits for a machine that cannot download MNIST: the 1,797 8 x 8
images of the UCI optical digits set that ships inside scikit-learn,
scaled 3x to 24 x 24, centred in 28 x 28 as MNIST's are, grey levels 0-16
stretched to 0-255. A seeded shuffle splits them 1,497 / 300.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.workloads import idx  # pylint: disable=g-import-not-at-top
from runtime.workloads import mnist  # pylint: disable=g-import-not-at-top

NUM_TEST = 300


def as_mnist(images: np.ndarray) -> np.ndarray:
  """(n, 8, 8) grey levels 0-16 -> (n, 28, 28) uint8."""
  big = np.kron(images, np.ones((3, 3))) * (255.0 / 16.0)
  out = np.zeros((len(images), 28, 28), np.uint8)
  out[:, 2:26, 2:26] = np.clip(np.round(big), 0, 255).astype(np.uint8)
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--data_dir', default='data/digits')
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  try:
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
  except ImportError:
    sys.exit('scikit-learn is missing: pip install -e .[digits]')
  digits = datasets.load_digits()
  order = np.random.default_rng(args.seed).permutation(len(digits.target))
  images = as_mnist(digits.images[order])
  labels = digits.target[order].astype(np.uint8)
  os.makedirs(args.data_dir, exist_ok=True)
  arrays = {
      'train_images': images[NUM_TEST:],
      'train_labels': labels[NUM_TEST:],
      'test_images': images[:NUM_TEST],
      'test_labels': labels[:NUM_TEST]
  }
  for key, array in arrays.items():
    idx.write(os.path.join(args.data_dir, mnist.FILES[key] + '.gz'), array)
  print(f'wrote {len(labels) - NUM_TEST} training and {NUM_TEST} test digits '
        f'to {args.data_dir}')


if __name__ == '__main__':
  main()
