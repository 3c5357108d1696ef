"""The data-parallel training loop that every training workload runs.

A workload describes its model and data as a `Task`; `train` does the rest:
splits each step's global batch among processes and devices, prepares the
next batches while a step runs, runs the data-parallel step (pmap or
jit(shard_map), `config.parallelism`), keeps the number of steps in flight
bounded, checks the loss, logs and writes metrics, reports progress to the
launcher and fingerprints the final parameters on every process.
"""

import collections
import dataclasses
import os
import time
from typing import Any, Callable, Optional

from absl import logging
import jax
import numpy as np
import optax

from runtime import checkpoint
from runtime import coordination
from runtime import data
from runtime import fingerprint as fingerprint_lib
from runtime import goodput
from runtime import metrics as metrics_lib
from runtime import parallelism as parallelism_lib
from runtime import prefetch
from runtime import preemption
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
    loss_uses_rng: call loss_fn(params, batch, rng) with a PRNG key that
      differs per device and per step.
    evaluate: optional `params -> {name: value}`, run on every process every
      config.eval_every steps and at the end, with the replicated parameters
      placed for config.parallelism (see runtime/evaluate.py); its results go
      to metrics.jsonl as eval_*.
  """
  params: Any
  loss_fn: step_lib.LossFn
  optimizer: optax.GradientTransformation
  load_examples: Callable[[np.ndarray], Any]
  num_examples: int
  loss_uses_rng: bool = False
  evaluate: Optional[Callable[[Any], dict[str, float]]] = None


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
  """Means of the metrics since the last log line, the speed, the input wait.

  The speed and the input wait leave out the first step of a run (start-up
  and compilation): they count from the end of that step.
  """

  def __init__(self):
    self.timing = False
    self.reset(time.perf_counter())

  def reset(self, now: float) -> None:
    self.start, self.steps, self.sums = now, 0, collections.defaultdict(float)
    self.timed_steps, self.input_wait_s = 0, 0.0

  def waited(self, seconds: float) -> None:
    if self.timing:
      self.input_wait_s += seconds

  def add(self, metrics: dict[str, float], now: float) -> None:
    self.steps += 1
    for k, v in metrics.items():
      self.sums[k] += v
    if self.timing:
      self.timed_steps += 1
    else:  # The run's first step: time from its end.
      self.timing, self.start = True, now

  def means(self) -> dict[str, float]:
    return {k: v / self.steps for k, v in self.sums.items()}

  def steps_per_sec(self, now: float) -> Optional[float]:
    if not self.timed_steps:
      return None
    return self.timed_steps / max(now - self.start, 1e-9)

  def input_wait_fraction(self, now: float) -> Optional[float]:
    if not self.timed_steps:
      return None
    return self.input_wait_s / max(now - self.start, 1e-9)


def _open_checkpoints(config, workdir: str) -> Optional[checkpoint.Checkpoints]:
  if not config.get('checkpointing', True):
    return None
  path = checkpoint.directory(config, workdir)
  checkpoint.check_shared(path)
  return checkpoint.Checkpoints(
      path, every=config.get('checkpoint_every', 0) or 0,
      keep=config.get('keep_checkpoints', 3),
      async_save=config.get('async_checkpointing', True))


def _restore(ckpt: checkpoint.Checkpoints, config, state: step_lib.TrainState,
             num_examples: int) -> tuple[int, step_lib.TrainState]:
  """The state to start from: the latest checkpoint's, or `state` at step 0."""
  if not config.get('restore', True):
    if ckpt.all_steps():
      raise checkpoint.CheckpointError(
          f'config.restore=False, but {ckpt.path} already holds the '
          f'checkpoints of steps {ckpt.all_steps()}. Use a new --workdir (or '
          'config.checkpoint_dir) to start afresh, or drop '
          '--config.restore=False to resume.')
    return 0, state
  restored = ckpt.restore_latest(config, state)
  if restored is None:
    return 0, state
  step, saved_state, meta = restored
  # The stream position is the step's only on the same data set; the config
  # need not name its size (MNIST reads it from files).
  if meta['data']['num_examples'] != num_examples:
    raise checkpoint.CheckpointError(
        f'the checkpoint of step {step} in {ckpt.path} was made on '
        f'{meta["data"]["num_examples"]} training examples; this run has '
        f'{num_examples}. Resume on the same data, or start afresh in a new '
        '--workdir.')
  return step, step_lib.TrainState(*saved_state)


def _meta(config, topo, task: Task, step: int, state, reason: str
          ) -> dict[str, Any]:
  return {
      'step': step,
      'reason': reason,
      'data': {**checkpoint.data_position(step, config.global_batch_size,
                                          task.num_examples),
               'num_examples': task.num_examples,
               'seed': config.seed},
      'config': checkpoint.trajectory_config(config),
      'state': checkpoint.describe_state(state),
      'saved_by': {'process_count': topo.process_count,
                   'device_count': topo.global_device_count,
                   'platform': topo.platform,
                   'jax_version': jax.__version__},
  }


def train(config, workdir: str, task: Task) -> dict[str, Any]:
  """Trains `task` to step `config.steps` on every device of the job.

  Resumes from the latest checkpoint in the run's checkpoint directory when
  there is one (config.restore, default True), saves every
  config.checkpoint_every steps and at the end, and on a preemption notice
  saves the step every process agreed on and raises `Preempted`.

  Args:
    config: reads steps, global_batch_size, seed, log_every and optionally
      parallelism ("pmap", default, or "shard_map"), prefetch (batches
      prepared ahead, default 2), shuffle (default True),
      max_steps_in_flight, checkpointing (default
      True), checkpoint_every, keep_checkpoints, checkpoint_dir, restore,
      async_checkpointing, restore_may_change.
    workdir: where metrics.jsonl (process 0), ranks/rank_<i>.json and, by
      default, checkpoints/ go.
    task: the model and data.

  Returns:
    {'final_metrics': metrics of the last step run here, 'fingerprint': of the
     final parameters, 'params': the final parameters as host numpy arrays,
     'start_step': the step this run started from}.

  Raises:
    BatchSizeError: when the global batch does not divide over the devices.
    NonFiniteLossError: naming the step whose loss is not finite.
    CheckpointError: when the checkpoint cannot be used, or its directory is
      not shared by every process.
    Preempted: after saving, on a preemption notice.
  """
  topo = topology_lib.current()
  global_batch = config.global_batch_size
  sharding.per_device_batch_size(global_batch, topo.process_count,
                                 topo.local_device_count)
  in_flight_limit = max_steps_in_flight(config, topo.platform)
  shuffle = config.get('shuffle', True)
  is_chief = topo.process_index == 0
  parallelism = parallelism_lib.of(config)

  step_fn = step_lib.make_train_step(task.loss_fn, task.optimizer,
                                     uses_rng=task.loss_uses_rng,
                                     parallelism=parallelism)
  state = step_lib.init_state(task.params, task.optimizer, config.seed)
  ledger = goodput.current()
  with ledger.timing('checkpoint_restore'):
    ckpt = _open_checkpoints(config, workdir)
    start = 0
    if ckpt is not None:
      start, state = _restore(ckpt, config, state, task.num_examples)
  state = step_lib.replicate(state, parallelism)
  writer = metrics_lib.MetricsWriter(workdir, is_chief,
                                     resume_step=start or None)
  resumed = f', resuming at step {start}' if start else ''
  writer.log(f'training {config.steps} steps, global batch {global_batch}, '
             f'{parallelism}, {in_flight_limit} step(s) in flight, on '
             f'{topo.describe()}{resumed}')

  def load(step: int):
    ids = data.process_batch_ids(step, global_batch, task.num_examples,
                                 config.seed, topo.process_index,
                                 topo.process_count, shuffle)
    return parallelism_lib.put_batch(task.load_examples(ids), parallelism)

  in_flight = collections.deque()
  window = _Window()
  clock = goodput.StepClock(ledger, goodput.steps_done_before(ledger))
  last = {}
  last_eval = {}
  eval_every = config.get('eval_every', 0) or 0

  def run_eval(done_step: int) -> None:
    nonlocal last_eval
    drain()
    started = time.perf_counter()
    with clock.timing('evaluation'):
      last_eval = {f'eval_{k}': v
                   for k, v in task.evaluate(state.params).items()}
    record = {**last_eval, 'eval_seconds': time.perf_counter() - started}
    writer.write(done_step, record)
    writer.log(f'eval at step {done_step}: ' + ' '.join(
        f'{k}={v:.6g}' for k, v in record.items()))

  def retire() -> None:
    nonlocal last
    done_step, pending = in_flight.popleft()
    last = {k: float(v)
            for k, v in parallelism_lib.to_host(pending).items()}
    _check_finite(done_step, last)
    clock.step_done(done_step)
    progress.report(done_step, topo.process_index,
                    force=done_step == config.steps)
    window.add(last, time.perf_counter())
    if done_step % config.log_every == 0 or done_step == config.steps:
      log_window(done_step)

  def log_window(done_step: int) -> None:
    now = time.perf_counter()
    record = window.means()
    steps_per_sec = window.steps_per_sec(now)
    if steps_per_sec is not None:
      record['steps_per_sec'] = steps_per_sec
      record['examples_per_sec'] = steps_per_sec * global_batch
      record['input_wait_fraction'] = window.input_wait_fraction(now)
    writer.write(done_step, record)
    eta = ('' if steps_per_sec is None else ' eta=' + metrics_lib.format_duration(
        (config.steps - done_step) / max(steps_per_sec, 1e-9)))
    shown = ' '.join(f'{k}={v:.6g}' for k, v in record.items())
    writer.log(f'step {done_step}/{config.steps} {shown}{eta}')
    window.reset(now)

  def drain() -> None:
    while in_flight:
      retire()

  def save(step: int, reason: str) -> None:
    with clock.timing('checkpoint_blocking'):
      host_state = parallelism_lib.to_host(state)
      ckpt.save(step, host_state,
                _meta(config, topo, task, step, host_state, reason))

  try:
    with preemption.Notice() as notice, prefetch.Prefetcher(
        load, range(start, config.steps),
        size=config.get('prefetch', 2)) as batches:
      for count, step in enumerate(range(start, config.steps), 1):
        batch, waited_s = batches.next(step)
        window.waited(waited_s)
        clock.take('input_wait', waited_s)
        dispatch_started = time.perf_counter()
        state, step_metrics = step_fn(state, batch)
        progress.begin(step + 1, waited_s + time.perf_counter() -
                       dispatch_started)
        in_flight.append((step + 1, step_metrics))
        while len(in_flight) >= in_flight_limit:
          retire()
        stop = notice.reached(count) and step + 1 < config.steps
        if stop:
          logging.warning('preemption notice: every process saves step %d '
                          'and stops', step + 1)
          drain()
          if window.steps:
            log_window(step + 1)  # Keep the metrics of the window so far.
          with clock.timing('preemption_save'):
            if ckpt is not None:
              save(step + 1, 'preemption')
              ckpt.wait()
            _sync_processes('podrun/preempted')
          raise preemption.Preempted(step + 1)
        if ckpt is not None and ckpt.due(step + 1) and step + 1 < config.steps:
          save(step + 1, 'periodic')
        if (task.evaluate is not None and eval_every and
            (step + 1) % eval_every == 0 and step + 1 < config.steps):
          run_eval(step + 1)
      drain()
      if task.evaluate is not None:
        run_eval(config.steps)
    if ckpt is not None:
      if start < config.steps:
        save(config.steps, 'final')
      with clock.timing('checkpoint_blocking'):
        ckpt.close()
  except BaseException:
    # Another process may be gone: waiting for a save that needs all of them
    # could hang. A single process still finishes the saves it started.
    if ckpt is not None and jax.process_count() == 1:
      ckpt.close()
    raise
  finally:
    clock.close()
    writer.close()

  params = parallelism_lib.to_host(state.params)
  fingerprint = fingerprint_lib.fingerprint(params)
  metrics_lib.write_json(
      os.path.join(workdir, 'ranks', f'rank_{topo.process_index}.json'), {
          'process_index': topo.process_index,
          'process_count': topo.process_count,
          'local_devices': [str(d) for d in jax.local_devices()],
          'steps': config.steps,
          'start_step': start,
          'fingerprint': fingerprint,
      })
  return {'final_metrics': last, 'fingerprint': fingerprint, 'params': params,
          'start_step': start, 'eval_metrics': last_eval}


def _sync_processes(name: str) -> None:
  """Waits (bounded) until every process gets here; no-op in one process."""
  job = coordination.current()
  if job is not None and job.process_count > 1:
    job.barrier(name)
