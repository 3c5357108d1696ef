"""Fields every job config has; the other configs start from `get_config()`."""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
  config = config_dict.ConfigDict()
  # 'package.module:function', called as function(config, workdir).
  config.workload = config_dict.placeholder(str)
  config.seed = 0
  config.steps = 100
  config.global_batch_size = 256
  config.log_every = 10
  config.learning_rate = 0.1
  # Reshuffle the data every epoch (see runtime/data.py).
  config.shuffle = True
  # Dispatched steps allowed to be unfinished; None: 1 on CPU, 2 elsewhere.
  config.max_steps_in_flight = config_dict.placeholder(int)

  # The pod the job expects; None accepts whatever is there.
  config.topology = config_dict.ConfigDict()
  config.topology.num_processes = config_dict.placeholder(int)
  config.topology.local_devices = config_dict.placeholder(int)
  # 'cpu', 'gpu' or 'tpu'.
  config.topology.platform = config_dict.placeholder(str)
  return config
