"""MNIST, an MLP (784-512-512-10) trained data-parallel with Adam.

  podrun-fetch-mnist --data_dir=data/mnist
  podrun --config=configs/mnist.py
  podrun --config=configs/mnist.py --local_processes=2 --local_devices=4
  podrun --config=configs/mnist.py --config.parallelism=shard_map
"""

from runtime import config_base


def get_config():
  config = config_base.get_config()
  config.workload = 'runtime.workloads.mnist:train_and_evaluate'
  # A path: it may move between a run and its resumption.
  config.data_dir = 'data/mnist'
  config.model.hidden_sizes = (512, 512)
  config.optimizer.learning_rate = 1e-3
  config.global_batch_size = 256
  # 60,000 examples / 256 = 234.4 steps an epoch: 10 epochs.
  config.steps = 2344
  config.log_every = 100
  config.eval_every = 500
  config.eval_batch_size = 1024
  config.checkpoint_every = 500
  return config
