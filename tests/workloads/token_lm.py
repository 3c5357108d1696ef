"""A next-token model over padded rows of different lengths, its loss
weighted by tokens as t5x, MaxText and Flax's LM1B weigh it.

Token 0 pads: each row holds 1 to T + 1 real tokens, then zeros, so the
devices of a step hold different counts of real target tokens. The step's
loss is the summed cross-entropy of the real targets over their count in the
whole global batch.

config.loss chooses how loss_fn says so:
  'weighted'     runtime.Weighted(summed loss, token count): exact on any
                 layout.
  'device_mean'  each device's own token mean (the mean of means: another
                 figure wherever the counts differ).
  'psum'         the sum over a lax.psum of the counts over the batch axis
                 (exact at one pass a device only, and refused otherwise).

`one_device(config, steps)` trains the same steps on one device with the
whole global batch: the figure every layout must reach. `config.kill_rank`
SIGKILLs that process once, after the call that runs `config.kill_step`.
"""

import os
import signal

import jax
from jax import lax
import jax.numpy as jnp
from ml_collections import ConfigDict
import numpy as np
import optax

import runtime
from runtime import data as data_lib
from runtime import hooks
from runtime import training


def tokens(num: int, length: int, vocab: int, seed: int) -> np.ndarray:
  """(num, length + 1) int32: real tokens 1..vocab-1, then padding 0."""
  rng = np.random.default_rng([seed, 11])
  rows = rng.integers(1, vocab, size=(num, length + 1)).astype(np.int32)
  real = rng.integers(1, length + 2, size=num)
  rows[np.arange(length + 1)[None, :] >= real[:, None]] = 0
  return rows


def init_params(config: ConfigDict) -> dict:
  rng = np.random.default_rng([config.seed, 12])
  v, d = config.model.vocab_size, config.model.width
  return {
      'embed': (0.3 * rng.standard_normal((v, d))).astype(np.float32),
      'out': (0.3 * rng.standard_normal((d, v))).astype(np.float32)
  }


def token_losses(params, rows):
  """(n, T) cross-entropy of each next token, and (n, T) 1 for a real target
  token, 0 for padding."""
  inputs, targets = rows[:, :-1], rows[:, 1:]
  logits = jnp.tanh(params['embed'][inputs]) @ params['out']
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return losses, (targets > 0).astype(jnp.float32)


def make_loss_fn(form: str, axis: str):

  def loss_fn(params, batch):
    losses, real = token_losses(params, batch['tokens'])
    total, count = (losses * real).sum(), real.sum()
    if form == 'weighted':
      return runtime.Weighted(total, count), {}
    if form == 'device_mean':
      return total / jnp.maximum(count, 1), {}
    if form == 'psum':
      return total / lax.psum(count, axis) * lax.psum(1, axis), {}
    raise ValueError(f'config.loss={form!r}; one of weighted, device_mean, '
                     'psum')

  return loss_fn


def metric_fn(params, batch):
  """Per row: its summed token loss and its count of real tokens."""
  losses, real = token_losses(params, batch['tokens'])
  return {'loss': runtime.Weighted((losses * real).sum(1), real.sum(1))}


class _KillOnce(hooks.Hook):
  """SIGKILLs this process after the call that runs `step`, in the first
  attempt only (a marker in the workdir says it happened)."""

  def __init__(self, step: int, marker: str):
    self.step, self.marker = step, marker

  def after_step(self, run) -> None:
    if run.step >= self.step and not os.path.exists(self.marker):
      open(self.marker, 'w').close()
      os.kill(os.getpid(), signal.SIGKILL)


def make_task(config: ConfigDict, workdir: str = '') -> runtime.Task:
  m = config.model
  held_out = runtime.ArraySource(tokens=tokens(
      config.eval_examples, m.sequence_length, m.vocab_size, config.seed + 1))
  extra = []
  if config.kill_rank == jax.process_index():
    extra.append(
        _KillOnce(config.kill_step, os.path.join(workdir, 'killed_once')))

  def evaluate(params, model_state):
    del model_state
    return runtime.evaluate(params, metric_fn, held_out, config.eval_batch_size,
                            runtime.parallelism.from_config(config))

  return runtime.Task(
      params=init_params(config),
      loss_fn=make_loss_fn(config.loss, config.axis_name or
                           runtime.parallelism.DATA_AXIS),
      optimizer=optax.sgd(config.learning_rate),
      data=runtime.ArraySource(
          tokens=tokens(config.data.num_examples, m.sequence_length,
                        m.vocab_size, config.seed)),
      eval_fn=evaluate,
      hooks=extra)


def one_device(config: ConfigDict, steps: int) -> tuple[dict, float]:
  """(params after `steps` steps, the held-out token-weighted loss) on one
  device with each step's whole global batch, in the runtime's data order."""
  task = make_task(config)
  optimizer = task.optimizer

  def loss(params, rows):
    losses, real = token_losses(params, rows)
    return (losses * real).sum() / real.sum()

  @jax.jit
  def step(params, opt_state, rows):
    grads = jax.grad(loss)(params, rows)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params = jax.tree_util.tree_map(jnp.asarray, task.params)
  opt_state = optimizer.init(params)
  for i in range(steps):
    ids = data_lib.global_batch_ids(i, config.global_batch_size, len(task.data),
                                    config.seed, config.data.shuffle)
    rows = data_lib.read_batch(task.data, ids)['tokens']
    params, opt_state = step(params, opt_state, rows)
  m = config.model
  held = tokens(config.eval_examples, m.sequence_length, m.vocab_size,
                config.seed + 1)
  losses, real = token_losses(params, held)
  return jax.device_get(params), float((losses * real).sum() / real.sum())


def train_and_evaluate(config: ConfigDict, workdir: str):
  return training.train(config, workdir, make_task(config, workdir))
