"""A decoder-only language model on synthetic tokens (runtime/workloads/
decoder.py): GPT-2 small's shape by default, for an accelerator; `:tiny`
for a CPU.

  podrun --config=configs/decoder.py           # 124 M parameters
  podrun --config=configs/decoder.py:tiny      # a few seconds on a CPU
"""

from runtime import config_base

# (layers, width, heads, vocabulary, sequence length, global batch)
SHAPES = {
    'gpt2_small': (12, 768, 12, 50257, 512, 16),
    'tiny': (2, 64, 4, 512, 32, 16),
}


def get_config(shape: str = 'gpt2_small'):
  if shape not in SHAPES:
    raise ValueError(f'configs/decoder.py:{shape}: no such shape; the shapes '
                     f'are {", ".join(SHAPES)}')
  layers, width, heads, vocab, length, batch = SHAPES[shape]
  config = config_base.get_config()
  config.workload = 'runtime.workloads.decoder:train_and_evaluate'
  config.model.shape = shape
  config.model.layers = layers
  config.model.width = width
  config.model.heads = heads
  config.model.vocab_size = vocab
  config.model.sequence_length = length
  # Compute each layer's activations again in the backward pass rather than
  # keep them: less memory, a third more FLOPs; with state_layout='sharded',
  # one layer's parameters and gradients are then whole at a time.
  config.model.remat = False
  config.optimizer.learning_rate = 3e-4
  config.optimizer.weight_decay = 0.1
  config.data.num_examples = 1024
  config.global_batch_size = batch
  config.steps = 100
  config.log_every = 10
  return config
