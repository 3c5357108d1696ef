"""The first seed: 3-d linear regression, SGD at learning rate 0.1.

  python -m launcher --config=configs/linear_regression.py
  python -m launcher --config=configs/linear_regression.py --local_processes=2
"""

from configs import base


def get_config():
  config = base.get_config()
  config.workload = 'runtime.workloads.linear_regression:train_and_evaluate'
  config.features = 3
  config.num_examples = 4096
  config.noise_std = 0.1
  config.global_batch_size = 256
  config.steps = 200
  config.log_every = 20
  config.learning_rate = 0.1
  return config
