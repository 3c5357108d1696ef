"""A decoder-only language model on synthetic tokens, in plain JAX.

Pre-norm blocks (causal self-attention, a GELU MLP of 4x the width) under
one `lax.scan` over the layers, tied input and output embeddings, float32
parameters and bfloat16 compute, AdamW. At configs/decoder.py's default
shape (GPT-2 small's: 12 layers, width 768, 12 heads, a vocabulary of
50,257, sequences of 512) it has 124 M parameters; it is what the chip
benchmark (tests/benchmarks/benchmark_chip.py) measures.

The tokens are drawn from the config's seed, so a run needs no files; the
loss falls only as far as unigram statistics allow.
"""

from typing import Any

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict
import numpy as np
import optax

import runtime

COMPUTE = jnp.bfloat16


def init_params(config: ConfigDict) -> dict[str, Any]:
  """The parameters, float32 host arrays; each layer's stacked on axis 0.

  Shapes: embed (V, d), position (T, d), norm (d,), and under 'layers'
  norm_1, norm_2 (L, d), qkv (L, d, 3d), out (L, d, d), up (L, d, 4d),
  down (L, 4d, d).

  Drawn by one compiled program on the default device and read back: 124 M
  normals take 3.2 s on a TPU host's CPU with numpy, which a restart paid
  before its restore replaced them (BUILD_NOTES.md, issue 81).
  """
  m = config.model
  d, layers = m.width, m.layers
  # GPT-2's: the residual projections scaled down by the depth.
  residual = 0.02 / np.sqrt(2 * layers)
  normals = {
      'embed': ((m.vocab_size, d), 0.02),
      'position': ((m.sequence_length, d), 0.02),
      'qkv': ((layers, d, 3 * d), 0.02),
      'out': ((layers, d, d), residual),
      'up': ((layers, d, 4 * d), 0.02),
      'down': ((layers, 4 * d, d), residual)
  }

  @jax.jit
  def draw(key):
    keys = jax.random.split(key, len(normals))
    return {
        name: scale * jax.random.normal(k, shape, jnp.float32)
        for k, (name, (shape, scale)) in zip(keys, normals.items())
    }

  drawn = jax.device_get(draw(jax.random.key(config.seed)))
  return {
      'embed': drawn['embed'],
      'position': drawn['position'],
      'norm': np.ones(d, np.float32),
      'layers': {
          'norm_1': np.ones((layers, d), np.float32),
          'qkv': drawn['qkv'],
          'out': drawn['out'],
          'norm_2': np.ones((layers, d), np.float32),
          'up': drawn['up'],
          'down': drawn['down'],
      },
  }


def _norm(x, scale):
  x32 = x.astype(jnp.float32)
  x32 = (x32 - x32.mean(
      -1, keepdims=True)) * jax.lax.rsqrt(x32.var(-1, keepdims=True) + 1e-5)
  return (x32 * scale.astype(jnp.float32)).astype(x.dtype)


def logits_fn(params,
              tokens: jnp.ndarray,
              heads: int,
              remat: bool = False) -> jnp.ndarray:
  """(n, T) int tokens -> (n, T, V) logits, bfloat16; with `remat`, each
  layer's activations are computed again in the backward pass instead of
  kept (`jax.checkpoint`), so that, with sharded state, one layer's
  gathered parameters live at a time."""
  p = jax.tree_util.tree_map(lambda a: a.astype(COMPUTE), params)
  n, length = tokens.shape
  x = p['embed'][tokens] + p['position'][:length]
  causal = jnp.tril(jnp.ones((length, length), bool))

  def block(x, layer):
    q, k, v = jnp.split(_norm(x, layer['norm_1']) @ layer['qkv'], 3, axis=-1)
    q, k, v = (a.reshape(n, length, heads, -1) for a in (q, k, v))
    scores = jnp.einsum('nqhd,nkhd->nhqk', q, k).astype(jnp.float32)
    scores = jnp.where(causal, scores / np.sqrt(q.shape[-1]), -1e30)
    weights = jax.nn.softmax(scores, axis=-1).astype(COMPUTE)
    attended = jnp.einsum('nhqk,nkhd->nqhd', weights, v).reshape(n, length, -1)
    x = x + attended @ layer['out']
    hidden = jax.nn.gelu(_norm(x, layer['norm_2']) @ layer['up'])
    return x + hidden @ layer['down'], None

  x, _ = jax.lax.scan(jax.checkpoint(block) if remat else block, x, p['layers'])
  return _norm(x, p['norm']) @ p['embed'].T


def make_loss_fn(heads: int, remat: bool = False):
  """`(params, batch) -> (loss, {})`: next-token cross-entropy of one
  device's sequences, batch['tokens'] (n, T + 1)."""

  def loss_fn(params, batch):
    tokens = batch['tokens']
    logits = logits_fn(params, tokens[:, :-1], heads, remat)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), tokens[:, 1:]).mean(), {}

  return loss_fn


def flops_per_example(config: ConfigDict) -> float:
  """The model's FLOPs for one sequence, forward and backward: 6 per
  parameter that multiplies (the output embedding's included) per token,
  and 12 x layers x width x T per token for attention (PaLM's count)."""
  m = config.model
  d, length = m.width, m.sequence_length
  per_layer = d * 3 * d + d * d + 2 * d * 4 * d
  matmul_params = m.layers * per_layer + m.vocab_size * d
  return float(length * (6 * matmul_params + 12 * m.layers * d * length))


def tokens(config: ConfigDict) -> np.ndarray:
  """(config.data.num_examples, T + 1) int32 tokens from the config's seed."""
  rng = np.random.default_rng([config.seed, 3])
  # Zipf-like frequencies, so that there is something to learn.
  ranks = np.arange(1, config.model.vocab_size + 1)
  weights = 1.0 / ranks
  return rng.choice(config.model.vocab_size,
                    size=(config.data.num_examples,
                          config.model.sequence_length + 1),
                    p=weights / weights.sum()).astype(np.int32)


def make_task(config: ConfigDict) -> runtime.Task:
  return runtime.Task(
      params=init_params(config),
      loss_fn=make_loss_fn(config.model.heads,
                           bool(config.model.get('remat', False))),
      optimizer=optax.adamw(config.optimizer.learning_rate,
                            weight_decay=config.optimizer.weight_decay),
      data=runtime.ArraySource(tokens=tokens(config)),
      flops_per_example=flops_per_example(config),
      tokens_per_example=config.model.sequence_length)


def train_and_evaluate(config: ConfigDict, workdir: str) -> runtime.TrainResult:
  return runtime.train(config, workdir, make_task(config))
