"""The second seed: ten million dot products of 3-d vectors, pmap against vmap.

  podrun --config=configs/dot_product.py
  podrun --config=configs/dot_product.py --config.reshape=False  # the runtime's error
"""

from runtime import config_base


def get_config():
  config = config_base.get_config()
  config.workload = 'runtime.workloads.dot_product:train_and_evaluate'
  config.num_pairs = 10_000_000
  # False hands pmap the flat (n, 3) arrays, which it cannot map.
  config.reshape = True
  return config
