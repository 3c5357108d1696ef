"""The character-level transformer with Flax's dropout layers
(tests/workloads/charlm.py).

  python -m launcher --config=tests/workloads/charlm_config.py
  python -m launcher --config=tests/workloads/charlm_config.py \
      --config.rng=example --local_processes=3 --local_devices=2
"""

from ml_collections import ConfigDict

from runtime import config_base


def get_config():
  config = config_base.get_config()
  config.workload = 'tests.workloads.charlm:train_and_evaluate'
  config.rng = ''  # '' (loss_uses_rng=True, one key a call) or 'example'.
  config.model = ConfigDict({
      'width': 32,
      'heads': 2,
      'length': 16,
      'dropout': 0.2
  })
  config.optimizer.learning_rate = 0.5
  config.optimizer.name = 'sgd'  # Or 'adam' (with a smaller rate).
  config.global_batch_size = 48  # 8 devices x 6, 6 devices x 8.
  config.data.num_examples = 480
  config.steps = 10
  config.log_every = 5
  config.checkpoint_every = 0  # Only at the end.
  return config
