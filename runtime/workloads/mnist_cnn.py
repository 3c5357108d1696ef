"""MNIST with a Flax NNX CNN: BatchNorm, dropout, warm-up cosine Adam.

Written only against the public API: `runtime.Task`, `runtime.train`,
`runtime.ArraySource` (via mnist.sources) and `runtime.evaluate`. BatchNorm's
batch statistics are the task's model state; dropout draws each example's
mask from that example's key (`runtime.dropout`), so a resumed run is exact
and any topology drops the same values.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
from ml_collections import ConfigDict
import optax

import runtime
from runtime.workloads import mnist


class CNN(nnx.Module):
  """(n, 784) images in [0, 1] -> (n, 10) logits."""

  def __init__(self, features: tuple[int, int], dense: int, dropout: float,
               rngs: nnx.Rngs):
    (c1, c2), side = features, 28 // 4
    self.conv1 = nnx.Conv(1, c1, (3, 3), use_bias=False, rngs=rngs)
    self.norm1 = nnx.BatchNorm(c1, momentum=0.9, rngs=rngs)
    self.conv2 = nnx.Conv(c1, c2, (3, 3), use_bias=False, rngs=rngs)
    self.norm2 = nnx.BatchNorm(c2, momentum=0.9, rngs=rngs)
    self.dense = nnx.Linear(side * side * c2, dense, rngs=rngs)
    self.dropout_rate = dropout
    self.out = nnx.Linear(dense, mnist.NUM_CLASSES, rngs=rngs)

  def __call__(self, images, train: bool, rng=None):
    x = images.reshape(-1, 28, 28, 1)
    for conv, norm in ((self.conv1, self.norm1), (self.conv2, self.norm2)):
      x = nnx.relu(norm(conv(x), use_running_average=not train))
      x = nnx.max_pool(x, (2, 2), strides=(2, 2))
    x = nnx.relu(self.dense(x.reshape(x.shape[0], -1)))
    if train:  # A mask per example, the same on any topology.
      x = runtime.dropout(rng, self.dropout_rate, x)
    return self.out(x)


def _forward(graphdef, params, batch_stats, images, train, rng=None):
  """(logits, new batch_stats) of a functional call of the model."""
  # Fresh Variables: BatchNorm updates its statistics inside jax.grad's
  # trace, which may not mutate Variables made outside it.
  model = nnx.merge(graphdef, params, batch_stats, copy=True)
  logits = model(images, train=train, rng=rng)
  return logits, nnx.state(model, nnx.BatchStat)


def _loss(graphdef, params, batch_stats, batch, rng):
  logits, batch_stats = _forward(graphdef, params, batch_stats, batch['image'],
                                 True, rng)
  loss = optax.softmax_cross_entropy_with_integer_labels(
      logits, batch['label']).mean()
  accuracy = jnp.mean(jnp.argmax(logits, -1) == batch['label'])
  return loss, ({'accuracy': accuracy}, batch_stats)


def _example_metrics(graphdef, variables, batch):
  """Per-example loss and correctness with the running statistics."""
  logits, _ = _forward(graphdef, *variables, batch['image'], False)
  labels = batch['label']
  return {
      'loss': optax.softmax_cross_entropy_with_integer_labels(logits, labels),
      'accuracy': (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  }


def make_task(config: ConfigDict, dataset) -> runtime.Task:
  """The task: the model's params and batch_stats, drawn from config.seed."""
  model = CNN(tuple(config.model.features), config.model.dense,
              config.model.dropout, nnx.Rngs(config.seed))
  graphdef, params, batch_stats = nnx.split(  # type: ignore[misc]
      model, nnx.Param, nnx.BatchStat)
  opt = config.optimizer
  schedule = optax.warmup_cosine_decay_schedule(0.0, opt.learning_rate,
                                                opt.warmup_steps,
                                                opt.decay_steps)
  split = mnist.sources(dataset)
  # One function object per graph, so the eval step compiles once.
  metrics_fn = functools.partial(_example_metrics, graphdef)
  return runtime.Task(
      params=jax.device_get(params),
      model_state=jax.device_get(batch_stats),
      loss_fn=functools.partial(_loss, graphdef),
      rng='example',
      optimizer=optax.adamw(schedule, weight_decay=opt.weight_decay),
      schedule=schedule,
      data=split['train'],
      eval_fn=lambda params, stats: runtime.evaluate(
          (params, stats), metrics_fn, split['test'], config.eval_batch_size,
          runtime.parallelism.from_config(config),
          config.get('device_batch_limit')))


def train_and_evaluate(config: ConfigDict, workdir: str) -> runtime.TrainResult:
  """Trains on the train split; eval_* are the exact test-split metrics."""
  return runtime.train(config, workdir,
                       make_task(config, mnist.load(config.data_dir)))
