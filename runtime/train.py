"""The data-parallel training loop that every training workload runs.

A workload describes its model and data as a `Task`; `train` does the rest:
splits each step's global batch among processes and devices, runs the pmap'd
step, keeps the number of steps in flight bounded, checks the loss, logs and
writes metrics, reports progress to the launcher and fingerprints the final
parameters on every process.
"""

import collections
import dataclasses
import os
import time
from typing import Any, Callable

import jax
import numpy as np
import optax

from runtime import data
from runtime import fingerprint as fingerprint_lib
from runtime import metrics as metrics_lib
from runtime import progress
from runtime import sharding
from runtime import step as step_lib
from runtime import topology as topology_lib


class NonFiniteLossError(FloatingPointError):
  """The loss became NaN or infinite."""


@dataclasses.dataclass(frozen=True)
class Task:
  """What a training workload hands to `train`.

  Attributes:
    params: initial parameters, a pytree of host arrays, identical on every
      process (draw them from the config's seed).
    loss_fn: `(params, batch) -> (loss, metrics)` on one device's examples.
    optimizer: an optax transformation.
    load_examples: `ids -> batch`; ids is an (n,) int64 array of example ids,
      batch a pytree of numpy arrays with leading dim n, in the order of ids.
    num_examples: how many examples the data set holds.
  """
  params: Any
  loss_fn: step_lib.LossFn
  optimizer: optax.GradientTransformation
  load_examples: Callable[[np.ndarray], Any]
  num_examples: int


def max_steps_in_flight(config, platform: str) -> int:
  """How many dispatched steps may be unfinished at once.

  One on CPU: emulated CPU devices that queue several collective steps can
  deadlock in the all-reduce rendezvous when there are fewer cores than
  devices (BUILD_NOTES.md). Two elsewhere, enough to keep an accelerator busy
  while the host prepares the next batch.
  """
  configured = config.get('max_steps_in_flight')
  if configured is not None:
    if configured < 1:
      raise ValueError(f'config.max_steps_in_flight={configured}; it must be '
                       'at least 1')
    return configured
  return 1 if platform == 'cpu' else 2


def _check_finite(step: int, metrics: dict[str, float]) -> None:
  loss = metrics['loss']
  if not np.isfinite(loss):
    raise NonFiniteLossError(
        f'the loss is {loss} at step {step}; stopping. Lower the learning rate'
        ' or check the data of that step.')


class _Window:
  """Means of the metrics and the speed since the last log line."""

  def __init__(self):
    self.reset(time.perf_counter())

  def reset(self, now: float) -> None:
    self.start, self.steps, self.sums = now, 0, collections.defaultdict(float)

  def add(self, metrics: dict[str, float]) -> None:
    self.steps += 1
    for k, v in metrics.items():
      self.sums[k] += v

  def means(self) -> dict[str, float]:
    return {k: v / self.steps for k, v in self.sums.items()}


def train(config, workdir: str, task: Task) -> dict[str, Any]:
  """Trains `task` for `config.steps` steps on every device of the job.

  Args:
    config: reads steps, global_batch_size, seed, log_every and optionally
      shuffle (default True) and max_steps_in_flight.
    workdir: where metrics.jsonl (process 0) and ranks/rank_<i>.json go.
    task: the model and data.

  Returns:
    {'final_metrics': metrics of the last step, 'fingerprint': of the final
     parameters, 'params': the final parameters as host numpy arrays}.

  Raises:
    BatchSizeError: when the global batch does not divide over the devices.
    NonFiniteLossError: naming the step whose loss is not finite.
  """
  topo = topology_lib.current()
  global_batch = config.global_batch_size
  sharding.per_device_batch_size(global_batch, topo.process_count,
                                 topo.local_device_count)
  in_flight_limit = max_steps_in_flight(config, topo.platform)
  shuffle = config.get('shuffle', True)
  is_chief = topo.process_index == 0

  step_fn = step_lib.make_train_step(task.loss_fn, task.optimizer)
  state = step_lib.init_state(task.params, task.optimizer)
  writer = metrics_lib.MetricsWriter(workdir, is_chief)
  writer.log(f'training {config.steps} steps, global batch {global_batch}, '
             f'{in_flight_limit} step(s) in flight, on {topo.describe()}')

  def load(step: int):
    ids = data.process_batch_ids(step, global_batch, task.num_examples,
                                 config.seed, topo.process_index,
                                 topo.process_count, shuffle)
    return sharding.split_for_devices(task.load_examples(ids),
                                      topo.local_device_count)

  in_flight = collections.deque()
  window = _Window()
  last = {}

  def retire() -> None:
    nonlocal last
    done_step, pending = in_flight.popleft()
    last = {k: float(v) for k, v in jax.device_get(pending).items()}
    _check_finite(done_step, last)
    progress.report(done_step, topo.process_index,
                    force=done_step == config.steps)
    if done_step == 1:
      window.reset(time.perf_counter())  # Leave compilation out of speeds.
      return
    window.add(last)
    if done_step % config.log_every == 0 or done_step == config.steps:
      log_window(done_step)

  def log_window(done_step: int) -> None:
    now = time.perf_counter()
    steps_per_sec = window.steps / max(now - window.start, 1e-9)
    record = {
        **window.means(),
        'steps_per_sec': steps_per_sec,
        'examples_per_sec': steps_per_sec * global_batch,
    }
    writer.write(done_step, record)
    eta = (config.steps - done_step) / max(steps_per_sec, 1e-9)
    shown = ' '.join(f'{k}={v:.6g}' for k, v in record.items())
    writer.log(f'step {done_step}/{config.steps} {shown} '
               f'eta={metrics_lib.format_duration(eta)}')
    window.reset(now)

  try:
    for step in range(config.steps):
      state, step_metrics = step_fn(state, load(step))
      in_flight.append((step + 1, step_metrics))
      while len(in_flight) >= in_flight_limit:
        retire()
    while in_flight:
      retire()
  finally:
    writer.close()

  params = jax.device_get(state.params)
  fingerprint = fingerprint_lib.fingerprint(params)
  metrics_lib.write_json(
      os.path.join(workdir, 'ranks', f'rank_{topo.process_index}.json'), {
          'process_index': topo.process_index,
          'process_count': topo.process_count,
          'local_devices': [str(d) for d in jax.local_devices()],
          'steps': config.steps,
          'fingerprint': fingerprint,
      })
  return {'final_metrics': last, 'fingerprint': fingerprint, 'params': params}
