"""A character-level transformer in Flax NNX whose dropout is Flax's own
(nnx.Dropout, fed by nnx.Rngs), as a user writes it from Flax's examples.

config.rng chooses how the loss gets its keys: '' keeps the model's code of
before per-example keys (`loss_uses_rng=True`, one key per call of the
loss); 'example' runs the same model once per example with its own key
(`runtime.per_example`), so its dropout is the same on any layout.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
from ml_collections import ConfigDict
import numpy as np
import optax

import runtime

TEXT = ('the quick brown fox jumps over the lazy dog; pack my box with five '
        'dozen liquor jugs. ')


class CharLM(nnx.Module):
  """(n, T) character ids -> (n, T, vocab) logits of the next character."""

  def __init__(self, vocab: int, width: int, heads: int, length: int,
               dropout: float, rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab, width, rngs=rngs)
    self.position = nnx.Embed(length, width, rngs=rngs)
    self.norm1 = nnx.LayerNorm(width, rngs=rngs)
    self.attention = nnx.MultiHeadAttention(num_heads=heads,
                                            in_features=width,
                                            decode=False,
                                            rngs=rngs)
    self.norm2 = nnx.LayerNorm(width, rngs=rngs)
    self.up = nnx.Linear(width, 4 * width, rngs=rngs)
    self.down = nnx.Linear(4 * width, width, rngs=rngs)
    self.dropout = nnx.Dropout(dropout)
    self.out = nnx.Linear(width, vocab, rngs=rngs)

  def __call__(self, tokens, rngs: nnx.Rngs):
    x = self.embed(tokens) + self.position(jnp.arange(tokens.shape[-1]))
    mask = nnx.make_causal_mask(tokens)
    x = x + self.dropout(self.attention(self.norm1(x), mask=mask), rngs=rngs)
    x = x + self.dropout(self.down(nnx.gelu(self.up(self.norm2(x)))), rngs=rngs)
    return self.out(x)


def sequences(num: int, length: int) -> dict[str, np.ndarray]:
  """`num` windows of TEXT: x (num, length) and the next characters y."""
  ids = np.array([sorted(set(TEXT)).index(c) for c in TEXT * 8], np.int32)
  starts = (np.arange(num) * 7) % (len(ids) - length - 1)
  windows = np.stack([ids[s:s + length + 1] for s in starts])
  return {'x': windows[:, :-1], 'y': windows[:, 1:]}


def forward(model: nnx.Module, inputs, rng, per_example: bool):
  """model(inputs, rngs=nnx.Rngs(dropout=...)): with one key for the call
  (rng uint32 (2,)), or once per example with its own (rng (n, 2))."""
  if per_example:
    return runtime.per_example(
        lambda key, x: model(x, rngs=nnx.Rngs(dropout=key)))(rng, inputs)
  return model(inputs, rngs=nnx.Rngs(dropout=rng))


def _loss(graphdef, per_example: bool, params, batch, rng):
  logits = forward(nnx.merge(graphdef, params), batch['x'], rng, per_example)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits,
                                                         batch['y']).mean()
  return loss, {}


_OPTIMIZERS = {'sgd': optax.sgd, 'adam': optax.adam}


def make_task(config: ConfigDict) -> runtime.Task:
  vocab = len(set(TEXT))
  model = CharLM(vocab, config.model.width,
                 config.model.heads, config.model.length, config.model.dropout,
                 nnx.Rngs(config.seed))
  graphdef, params = nnx.split(model, nnx.Param)
  per_example = config.rng == 'example'
  return runtime.Task(
      params=jax.device_get(params),
      loss_fn=functools.partial(_loss, graphdef, per_example),
      optimizer=_OPTIMIZERS[config.optimizer.get('name', 'sgd')](
          config.optimizer.learning_rate),
      data=runtime.ArraySource(
          **sequences(config.data.num_examples, config.model.length)),
      **({
          'rng': 'example'
      } if per_example else {
          'loss_uses_rng': True
      }))


def train_and_evaluate(config: ConfigDict, workdir: str):
  return runtime.train(config, workdir, make_task(config))
