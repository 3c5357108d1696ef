"""The next-token model with its loss weighted by tokens
(tests/workloads/token_lm.py).

  python -m launcher --config=tests/workloads/token_lm_config.py
  python -m launcher --config=tests/workloads/token_lm_config.py \
      --local_processes=2 --local_devices=4 --config.microbatches=2
"""

from ml_collections import ConfigDict

from runtime import config_base


def get_config():
  config = config_base.get_config()
  config.workload = 'tests.workloads.token_lm:train_and_evaluate'
  config.loss = 'weighted'  # Or 'device_mean', 'psum'.
  config.model = ConfigDict({
      'vocab_size': 32,
      'width': 16,
      'sequence_length': 12
  })
  config.learning_rate = 0.5
  config.global_batch_size = 32
  config.data.num_examples = 320
  config.eval_examples = 100
  config.eval_batch_size = 24  # Pads its last batch on 8 devices.
  config.steps = 20
  config.log_every = 5
  config.checkpoint_every = 0  # Only at the end.
  config.kill_rank = -1
  config.kill_step = 0
  return config
