"""The first seed: 3-d linear regression, SGD at learning rate 0.1.

  podrun --config=configs/linear_regression.py
  podrun --config=configs/linear_regression.py --local_processes=2
"""

from runtime import config_base


def get_config():
  config = config_base.get_config()
  config.workload = 'runtime.workloads.linear_regression:train_and_evaluate'
  config.data.features = 3
  config.data.num_examples = 4096
  config.data.noise_std = 0.1
  config.optimizer.learning_rate = 0.1
  config.global_batch_size = 256
  config.steps = 200
  config.log_every = 20
  return config
