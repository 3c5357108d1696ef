"""A small MLP classifier on synthetic, learnable data, with Adam.

  podrun --config=configs/mlp.py
  podrun --config=configs/mlp.py --local_processes=2 --local_devices=4
"""

from runtime import config_base


def get_config():
  config = config_base.get_config()
  config.workload = 'runtime.workloads.mlp:train_and_evaluate'
  config.data.features = 16
  config.data.num_classes = 4
  config.data.num_examples = 8192
  config.model.hidden = 64
  config.optimizer.learning_rate = 0.01
  config.global_batch_size = 512
  config.steps = 300
  config.log_every = 50
  return config
