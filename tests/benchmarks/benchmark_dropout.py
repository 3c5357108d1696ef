"""What a key per example costs against one key per call, for Flax's own
dropout layers (runtime/randomness.py).

  python tests/benchmarks/benchmark_dropout.py [--rounds=3] [--steps=30]

Two models, each trained by the same pmap step over 8 emulated CPU devices
with its forward pass written once:
- cnn: configs/mnist_cnn.py's CNN (32 and 64 3x3 convolutions, a dense
  layer of 256, global batch 256) with nnx.Dropout(0.3) after the dense
  layer and without BatchNorm, whose batch statistics would mix the
  examples that runtime.per_example keeps apart;
- charlm: tests/workloads/charlm.py's transformer (global batch 48).
Under Task(rng='device') the model gets nnx.Rngs(dropout=rng) once a call;
under rng='example' the same model runs through runtime.per_example.
Steps per second after the first (compiling) step, each run blocking on
every step as the runtime does on CPU; the rounds alternate the two forms,
and the ratio is the median of the rounds' ratios. Prints one JSON object.
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
sys.path.insert(0, REPO)

from flax import nnx  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import optax  # pylint: disable=g-import-not-at-top,wrong-import-position

import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime import parallelism  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime import step as step_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests.workloads import charlm  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests.workloads import charlm_config  # pylint: disable=g-import-not-at-top,wrong-import-position


class _CNN(nnx.Module):
  """configs/mnist_cnn.py's CNN without BatchNorm, with nnx.Dropout."""

  def __init__(self, rngs: nnx.Rngs):
    self.conv1 = nnx.Conv(1, 32, (3, 3), rngs=rngs)
    self.conv2 = nnx.Conv(32, 64, (3, 3), rngs=rngs)
    self.dense = nnx.Linear(7 * 7 * 64, 256, rngs=rngs)
    self.dropout = nnx.Dropout(0.3)
    self.out = nnx.Linear(256, 10, rngs=rngs)

  def __call__(self, images, rngs: nnx.Rngs):
    x = images.reshape(-1, 28, 28, 1)
    for conv in (self.conv1, self.conv2):
      x = nnx.max_pool(nnx.relu(conv(x)), (2, 2), strides=(2, 2))
    x = nnx.relu(self.dense(x.reshape(x.shape[0], -1)))
    return self.out(self.dropout(x, rngs=rngs))


def _cnn_loss(graphdef, per_example, params, batch, rng):
  logits = charlm.forward(nnx.merge(graphdef, params), batch['x'], rng,
                          per_example)
  return optax.softmax_cross_entropy_with_integer_labels(logits,
                                                         batch['y']).mean(), {}


def _cnn_task(per_example: bool):
  graphdef, params = nnx.split(_CNN(nnx.Rngs(0)), nnx.Param)
  rows = np.random.default_rng(0)
  source = runtime.ArraySource(x=rows.random((2048, 784), np.float32),
                               y=rows.integers(0, 10, 2048).astype(np.int32))
  return runtime.Task(params=jax.device_get(params),
                      optimizer=optax.sgd(0.01),
                      data=source,
                      loss_fn=functools.partial(_cnn_loss, graphdef,
                                                per_example),
                      rng='example' if per_example else 'device'), 256


def _charlm_task(per_example: bool):
  config = charlm_config.get_config()
  config.rng = 'example' if per_example else ''
  return charlm.make_task(config), config.global_batch_size


def steps_per_sec(task, global_batch: int, steps: int) -> float:
  par = parallelism.PMAP
  step_fn = step_lib.make_train_step(task.loss_fn,
                                     task.optimizer,
                                     par,
                                     rng=task.rng or 'device')
  state = par.replicate(step_lib.init_state(task.params, task.optimizer, 0))
  started = None
  for step in range(steps + 1):
    ids = data.process_batch_ids(step, global_batch, len(task.data), 0, 0, 1)
    state, metrics = step_fn(state,
                             par.put_batch(data.read_batch(task.data, ids)))
    float(metrics['loss'])
    if started is None:
      started = time.perf_counter()
  return steps / (time.perf_counter() - started)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=30)
  args = parser.parse_args()
  out = {'jax': jax.__version__, 'devices': jax.device_count()}
  for name, make in (('cnn', _cnn_task), ('charlm', _charlm_task)):
    ratios, rates = [], {'device': [], 'example': []}
    for _ in range(args.rounds):
      for form, per_example in (('device', False), ('example', True)):
        rates[form].append(steps_per_sec(*make(per_example), args.steps))
      ratios.append(rates['example'][-1] / rates['device'][-1])
    out[name] = {
        'steps_per_sec': {
            k: statistics.median(v) for k, v in rates.items()
        },
        'example_vs_device': statistics.median(ratios)
    }
  print(json.dumps(out, indent=1))


if __name__ == '__main__':
  main()
