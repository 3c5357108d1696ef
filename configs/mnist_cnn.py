"""MNIST with a Flax NNX CNN (BatchNorm, dropout), warm-up cosine AdamW.

  podrun-fetch-mnist --data_dir=data/mnist
  podrun --config=configs/mnist_cnn.py
  podrun --config=configs/mnist_cnn.py --local_processes=2 --local_devices=4
"""

from configs import mnist


def get_config():
  config = mnist.get_config()
  config.workload = 'runtime.workloads.mnist_cnn:train_and_evaluate'
  del config.model.hidden_sizes
  config.model.features = (32, 64)
  config.model.dense = 256
  config.model.dropout = 0.3
  config.optimizer.learning_rate = 3e-3
  config.optimizer.weight_decay = 1e-4
  config.optimizer.warmup_steps = 100
  # The schedule's length, part of the trajectory: a resumed run that goes
  # on longer keeps it, unless this changes too (and the resume is refused).
  config.optimizer.decay_steps = 1000
  config.steps = 1000
  config.eval_every = 250
  config.checkpoint_every = 250
  return config
