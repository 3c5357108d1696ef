"""Fetches MNIST: `podrun-fetch-mnist` (runtime/workloads/fetch_mnist.py)
from a checkout.

  python scripts/fetch_mnist.py [--data_dir=data/mnist] [--mirror=URL]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.workloads import fetch_mnist  # pylint: disable=g-import-not-at-top,wrong-import-position

if __name__ == '__main__':
  fetch_mnist.run()
