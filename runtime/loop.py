"""The step loop: small and fixed; everything periodic is a hook.

Per step the loop takes the prepared batch, dispatches the step, keeps at
most `max_steps_in_flight` steps unfinished (reading each finished step's
metrics back: the loss check, progress for the supervisor, goodput, the
metrics window) and calls every hook (runtime/hooks.py).
"""

import collections
import time
from typing import Any, Callable, Optional, Sequence

from absl import logging
import jax
from ml_collections import ConfigDict
import numpy as np

from runtime.checkpoints import shard_parts
from runtime.common import deprecations
from runtime.common import exit_codes
from runtime.common import goodput
from runtime.common import progress
from runtime import flops as flops_lib
from runtime import metrics as metrics_lib
from runtime import options as options_lib
from runtime import parallelism as parallelism_lib
from runtime import step as step_lib


class NonFiniteLossError(exit_codes.PodrunError, FloatingPointError):
  """The loss became NaN or infinite (exit 1, like any workload failure)."""
  exit_code = exit_codes.FAILED
  # Every process sees the same pmean'd loss, but a peer may have failed
  # first for another reason: wait for its cause as for any failure.
  consequence_possible = True


def check_finite(step: int, metrics: dict[str, float]) -> None:
  """Raises NonFiniteLossError naming `step` when its loss is NaN or inf."""
  loss = metrics['loss']
  if not np.isfinite(loss):
    raise NonFiniteLossError(
        f'the loss is {loss} at step {step}; stopping. Lower the learning rate'
        ' or check the data of that step.')


class Run:
  """The loop's state, as hooks see it after each step.

  Attributes:
    options: what `train` read of its config (runtime/options.py).
    workdir, task: what `train` was given.
    parallelism: how the state is placed (runtime/parallelism.py).
    process_index: this process.
    state: the `TrainState` after step `step`, replicated, or split as
      `placed` says.
    placed: a TrainState of NamedShardings when the state is sharded
      (runtime/parallelism/state_layout.py), else None.
    start_step: the step this run started from (restored or 0).
    step: steps done, counting those of earlier runs.
    steps: the step the run ends at (options.steps).
    count: steps this process has run since it started.
    writer: metrics.jsonl, TensorBoard and the log (process 0).
    clock: goodput accounting of this process.
    window: the metrics since the last log record.
    last_metrics: the host metrics of the newest finished step.
    eval_metrics: the newest evaluation's results, eval_*.
    figures: FLOPs per step, the device's peak and the run's mean speed
      (runtime/flops.py); None: the step lines give no TFLOP/s.
  """

  def __init__(self, options: options_lib.Options, workdir: str, task,
               state: step_lib.TrainState, start_step: int,
               parallelism: parallelism_lib.Parallelism, process_index: int,
               writer: metrics_lib.MetricsWriter, clock: goodput.StepClock,
               in_flight_limit: int, config: Optional[ConfigDict] = None,
               placed: Optional[step_lib.TrainState] = None,
               figures: Optional[flops_lib.Figures] = None):
    self.options, self.workdir, self.task = options, workdir, task
    self.placed, self.figures = placed, figures
    self._copy = (None if placed is None else
                  jax.jit(lambda state: state, out_shardings=placed))
    self._config = config  # Only for `config`, which goes.
    self.parallelism, self.process_index = parallelism, process_index
    self.state, self.start_step, self.step = state, start_step, start_step
    self.steps, self.count = options.steps, 0
    self.writer, self.clock = writer, clock
    self.window = metrics_lib.Window()
    self.last_metrics: dict[str, float] = {}
    self.eval_metrics: dict[str, float] = {}
    self._in_flight = collections.deque()
    self._in_flight_limit = in_flight_limit

  @property
  def final(self) -> bool:
    """Whether `step` is the run's last."""
    return self.step == self.steps

  def numpy_state(self) -> step_lib.TrainState:
    """The state after step `step` as numpy arrays (waits for it)."""
    return self.parallelism.to_host(self.state)

  def local_state(self) -> step_lib.TrainState:
    """The state after step `step` as this process's local tier keeps it:
    numpy arrays, whole when replicated; for a sharded state only the
    blocks this process's devices hold (runtime/checkpoints/shard_parts.py),
    so no host holds the whole state."""
    if self.placed is None:
      return self.numpy_state()
    return shard_parts.own(self.state)

  @property
  def part(self) -> Optional[dict[str, int]]:
    """Where this process's part of a sharded state sits and how it is
    split (what its local copies record: `shard_parts.record`); None when
    replicated."""
    if self.placed is None:
      return None
    return shard_parts.record(self.placed, self.process_index)

  def saved_state(self) -> step_lib.TrainState:
    """The state after step `step` as the persistent tier saves it.

    Replicated: numpy arrays (`numpy_state`), which process 0 writes.
    Sharded: a copy on the devices, split as the state is, of which orbax
    writes each shard once, from the process that holds it; no process
    holds the whole state on its host. A copy, because the next step
    donates the state's own buffers while the save still reads them; it
    costs one more shard per device until the save has it on the host.
    """
    if self._copy is None:
      return self.numpy_state()
    return self._copy(self.state)

  @property
  def config(self) -> Optional[ConfigDict]:
    """The config `train` was given; hooks read `options` now."""
    deprecations.warn('Run.config')
    return self._config

  def host_state(self) -> step_lib.TrainState:
    """Deprecated: the old name of `numpy_state`, kept for one release."""
    deprecations.warn('Run.host_state')
    return self.numpy_state()

  def dispatched(self, step: int, metrics: Any) -> None:
    """Records a dispatched step; waits while too many are unfinished."""
    self.step, self.count = step, self.count + 1
    self._in_flight.append((step, metrics))
    while len(self._in_flight) >= self._in_flight_limit:
      self._retire()

  def drain(self) -> None:
    """Waits for every dispatched step and takes in its metrics."""
    while self._in_flight:
      self._retire()

  def _retire(self) -> None:
    done_step, pending = self._in_flight.popleft()
    metrics = {k: float(v)
               for k, v in self.parallelism.to_host(pending).items()}
    check_finite(done_step, metrics)
    self.last_metrics = metrics
    self.clock.step_done(done_step)
    progress.report(done_step, self.process_index,
                    force=done_step == self.steps)
    self.window.add(metrics, time.perf_counter())


def run_steps(run: Run, step_fn: Callable, next_batch: Callable,
              hooks: Sequence[Any]) -> None:
  """Runs steps run.start_step + 1 .. run.steps, calling the hooks.

  Args:
    run: the loop's state; run.state is replaced after every step.
    step_fn: `(state, batch) -> (state, metrics)`, the mapped step.
    next_batch: `step -> (placed batch, seconds waited for it)`, 0-based.
    hooks: each with begin, after_step and end (runtime/hooks.py).
  """
  begun = []  # Ended in `finally`, also when a later hook's begin fails.
  error: Optional[BaseException] = None
  try:
    for hook in hooks:
      hook.begin(run)
      begun.append(hook)
    for step in range(run.start_step, run.steps):
      batch, waited_s = next_batch(step)
      run.window.waited(waited_s)
      run.clock.take('input_wait', waited_s)
      first = step == run.start_step
      if first:
        # Its dispatch compiles and agrees on the step program, waiting for
        # every process: the others must see that this one has its batch.
        progress.begin(step + 1)
      dispatch_started = time.perf_counter()
      run.state, metrics = step_fn(run.state, batch)
      if not first:
        progress.begin(step + 1, waited_s + time.perf_counter() -
                       dispatch_started)
      run.dispatched(step + 1, metrics)
      for hook in hooks:
        hook.after_step(run)
    run.drain()
  except BaseException as e:
    error = e
    raise
  finally:
    for hook in reversed(begun):
      _end(hook, run, error)


def _end(hook, run: Run, error: Optional[BaseException]) -> None:
  if error is None:
    hook.end(run, None)
    return
  try:
    hook.end(run, error)
  except Exception as e:  # pylint: disable=broad-except
    # The error that stopped the loop is the one to report.
    logging.error('%s.end after %s: %s', type(hook).__name__,
                  type(error).__name__, e)
