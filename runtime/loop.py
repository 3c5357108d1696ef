"""The step loop: small and fixed; everything periodic is a hook.

Per dispatch (one step, or config.steps_per_dispatch of them:
runtime/dispatch.py) the loop takes the prepared batch, calls the step,
keeps at most `max_steps_in_flight` calls unfinished (reading each finished
step's metrics back: the loss check, progress for the supervisor, goodput,
the metrics window) and calls every hook (runtime/hooks.py).
"""

import collections
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from absl import logging
import jax
import jax.numpy as jnp
from ml_collections import ConfigDict
import numpy as np

from runtime.checkpoints import shard_parts
from runtime.common import deprecations
from runtime.common import exit_codes
from runtime.common import goodput
from runtime.common import progress
from runtime import metrics as metrics_lib
from runtime import step as step_lib

if TYPE_CHECKING:  # plan imports the hooks, which import this module.
  from runtime import plan as plan_lib  # pylint: disable=g-bad-import-order


class NonFiniteLossError(exit_codes.PodrunError, FloatingPointError):
  """The loss became NaN or infinite (exit 1, like any workload failure)."""
  exit_code = exit_codes.FAILED
  # Every process sees the same pmean'd loss, but a peer may have failed
  # first for another reason: wait for its cause as for any failure.
  consequence_possible = True


# One program copies the whole state on its device (one dispatch, one
# compilation), rather than one per leaf and shape.
_copied = jax.jit(lambda tree: jax.tree_util.tree_map(jnp.copy, tree))


def first_non_finite(stacked: dict[str, np.ndarray]) -> Optional[int]:
  """The index of the first of a call's steps whose loss is NaN or inf,
  but for a step the loss scale skipped (runtime/loss_scale.py), which
  changed nothing; None where every loss is finite.

  Args:
    stacked: {metric: (steps,) float64}, one call's.
  """
  bad = ~np.isfinite(stacked['loss'])
  skipped = stacked.get('loss_scale_skipped')
  if skipped is not None:
    bad &= skipped == 0
  return int(np.argmax(bad)) if bad.any() else None


def non_finite_error(step: int, loss: float) -> NonFiniteLossError:
  return NonFiniteLossError(
      f'the loss is {loss} at step {step}; stopping (exit 1). Lower the '
      'learning rate or check the data of that step; in float16, '
      'Task(loss_scale=runtime.DynamicScale()) skips a step whose '
      'gradients are not finite instead.')


# The share of a device's memory a copy of the state may take it up to.
_ROOM_SHARE = 0.9


def device_has_room(state: Any) -> bool:
  """Whether the first local device has the memory for one more copy of
  `state` (a replicated state: one copy per device), below _ROOM_SHARE of
  its limit. True where the device does not say (a CPU: host memory)."""
  stats = jax.local_devices()[0].memory_stats()
  if not stats or 'bytes_limit' not in stats:
    return True
  size = sum(leaf.size * leaf.dtype.itemsize
             for leaf in jax.tree_util.tree_leaves(state))
  return (stats.get('bytes_in_use', 0) + size
          <= _ROOM_SHARE * stats['bytes_limit'])


class Run:
  """The loop's state, as hooks see it after each step.

  Attributes:
    options: what `train` read of its config (runtime/options.py).
    workdir, task: what `train` was given.
    parallelism: how the step maps over the devices (runtime/parallelism/).
    process_index: this process.
    state: the `TrainState` after step `step`, replicated, or split as
      `state_layout` says.
    state_layout: where the state lives, replicated or sharded
      (runtime/parallelism/state_layout.py `StateLayout`).
    start_step: the step this run started from (restored or 0).
    step: steps done, counting those of earlier runs.
    steps: the step the run ends at (options.steps).
    count: steps this process has run since it started.
    dispatches: calls of the step this process has made since it started
      (the same on every process).
    writer: metrics.jsonl, TensorBoard and the log (process 0).
    clock: goodput accounting of this process.
    window: the metrics since the last log record.
    last_metrics: the host metrics of the newest finished step.
    eval_metrics: the newest evaluation's results, eval_*.
    figures: FLOPs per step, the device's peak and the run's mean speed
      (runtime/flops.py); None: the step lines give no TFLOP/s.
  """

  def __init__(self, plan: 'plan_lib.Plan', task, state: step_lib.TrainState,
               start_step: int, writer: metrics_lib.MetricsWriter,
               clock: goodput.StepClock):
    """`plan`: the run's (runtime/plan.py `Plan`), whose options, record,
    parallelism, topology, state layout, calls in flight and figures the
    loop uses; `state`: the restored state, placed on the devices as the
    plan's layout says, at `start_step`."""
    options = plan.options
    self.options, self.workdir, self.task = options, plan.record.workdir, task
    self.state_layout = plan.state_layout
    self.figures = plan.figures
    shardings = self.state_layout.shardings
    self._copy = (jax.jit(lambda state: state, out_shardings=shardings)
                  if self.state_layout.sharded else None)
    self._config = plan.config  # Only for `config`, which goes.
    self.parallelism = plan.parallelism
    self.process_index = plan.topology.process_index
    self.state, self.start_step, self.step = state, start_step, start_step
    self.steps, self.count, self.dispatches = options.steps, 0, 0
    self.writer, self.clock = writer, clock
    self.window = metrics_lib.Window(clock.paused_here)
    self.last_metrics: dict[str, float] = {}
    self.eval_metrics: dict[str, float] = {}
    self._in_flight: collections.deque[tuple[int, int,
                                             Any]] = (collections.deque())
    self._in_flight_limit = plan.in_flight
    # Called with the last step of every call whose metrics are in.
    self.on_retired: list[Callable[[int], None]] = []
    # (the last step's state, its host copy), once read.
    self._final_host: Optional[tuple[Any, step_lib.TrainState]] = None

  @property
  def final(self) -> bool:
    """Whether `step` is the run's last."""
    return self.step == self.steps

  def numpy_state(self) -> step_lib.TrainState:
    """The state after step `step` as numpy arrays (waits for it). The last
    step's is read once: the final save and the run's result share it (the
    124 M decoder's end spent 3.7 s in `results` on a TPU v5e, reading its
    1.4 GB again among them)."""
    if self._final_host is not None and self._final_host[0] is self.state:
      return self._final_host[1]
    host = self.parallelism.to_host(self.state)
    if self.final:
      self._final_host = (self.state, host)
    return host

  def local_state(self) -> step_lib.TrainState:
    """The state after step `step` as this process's local tier keeps it:
    numpy arrays, whole when replicated; for a sharded state only the
    blocks this process's devices hold (runtime/checkpoints/shard_parts.py),
    so no host holds the whole state."""
    if not self.state_layout.sharded:
      return self.numpy_state()
    return shard_parts.own(self.state)

  def local_state_later(self) -> Callable[[], step_lib.TrainState]:
    """`local_state`, read to the host later: `() -> that state`.

    Replicated, where the device has the memory for one more state: a copy
    on the device now (the next step donates the state's own buffers), its
    copy to the host started at once, and the callable, which a thread may
    call while the loop goes on, waits for it. The loop then waits only for
    the copy's dispatch. Otherwise (a sharded state, or a device short of
    memory) the state is read now and the callable returns it.
    """
    if self.state_layout.sharded or not device_has_room(self.state):
      host = self.local_state()
      return lambda: host
    copies = _copied(
        jax.tree_util.tree_map(lambda x: x.addressable_data(0), self.state))
    for leaf in jax.tree_util.tree_leaves(copies):
      leaf.copy_to_host_async()
    return lambda: jax.tree_util.tree_map(np.asarray, copies)

  @property
  def part(self) -> Optional[dict[str, int]]:
    """Where this process's part of a sharded state sits and how it is
    split (what its local copies record: `shard_parts.record`); None when
    replicated."""
    if not self.state_layout.sharded:
      return None
    return shard_parts.record(self.state_layout.shardings, self.process_index)

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

  def dispatched(self, step: int, metrics: Any, steps: int = 1) -> None:
    """Records a call that ran `steps` steps up to `step` (metrics stacked
    over them when steps > 1); waits while too many calls are unfinished."""
    self.step, self.count = step, self.count + steps
    self.dispatches += 1
    for leaf in jax.tree_util.tree_leaves(metrics):
      if isinstance(leaf, jax.Array) and leaf.is_fully_addressable:
        # Its copy starts as soon as the step ends; the retire finds it
        # on the host.
        leaf.copy_to_host_async()
    self._in_flight.append((step, steps, metrics))
    while len(self._in_flight) >= self._in_flight_limit:
      self._retire()

  def drain(self) -> None:
    """Waits for every dispatched step and takes in its metrics."""
    while self._in_flight:
      self._retire()

  def _retire(self) -> None:
    """Takes in the oldest call's metrics. Its steps are handled as arrays,
    not one by one: at hundreds of steps a call, a step's own Python on the
    host would cost more than the device's step (issue 82)."""
    last_step, steps, pending = self._in_flight.popleft()
    stacked = {
        k: np.reshape(np.asarray(v, np.float64), (steps,))
        for k, v in self.parallelism.to_host(pending).items()
    }
    bad = first_non_finite(stacked) if 'loss' in stacked else None
    if bad is not None:
      # The steps before it are done and counted; it stops the run.
      self._steps_done({
          k: v[:bad] for k, v in stacked.items()
      }, last_step - steps + bad, bad)
      raise non_finite_error(last_step - steps + 1 + bad,
                             float(stacked['loss'][bad]))
    self._steps_done(stacked, last_step, steps)
    # Once a call: its steps' mean interval is what the supervisor and the
    # cadences learn (one report a step would give all but one step 0 s).
    progress.report(last_step,
                    self.process_index,
                    force=last_step == self.steps)
    for callback in self.on_retired:
      callback(last_step)

  def _steps_done(self, stacked: dict[str, np.ndarray], last_step: int,
                  steps: int) -> None:
    if not steps:
      return
    self.last_metrics = {k: float(v[-1]) for k, v in stacked.items()}
    self.clock.step_done(last_step, steps)
    self.window.add(stacked, steps, time.perf_counter())


def run_steps(run: Run, step_fn: Callable[[int], Callable],
              next_batch: Callable, hooks: Sequence[Any]) -> None:
  """Runs steps run.start_step + 1 .. run.steps, calling the hooks after
  every dispatch.

  Args:
    run: the loop's state; run.state is replaced after every dispatch.
    step_fn: `steps -> ((state, batch) -> (state, metrics))`, the mapped
      step that runs that many steps per call.
    next_batch: `step -> (steps, placed batch, seconds waited for it)`: the
      dispatch that follows `step` (0-based) and its batch
      (runtime/dispatch.py `Dispatches.next`).
    hooks: each with begin, after_step and end (runtime/hooks.py).
  """
  begun = []  # Ended in `finally`, also when a later hook's begin fails.
  error: Optional[BaseException] = None
  try:
    for hook in hooks:
      hook.begin(run)
      begun.append(hook)
    step = run.start_step
    programs = set()
    while step < run.steps:
      steps, batch, waited_s = next_batch(step)
      first = steps not in programs
      run.window.waited(waited_s, new_program=first)
      run.clock.take('input_wait', waited_s)
      programs.add(steps)
      if first:
        # Its dispatch compiles and agrees on the step program, waiting for
        # every process: the others must see that this one has its batch.
        progress.begin(step + steps)
      dispatch_started = time.perf_counter()
      run.state, metrics = step_fn(steps)(run.state, batch)
      if not first:
        progress.begin(step + steps,
                       waited_s + time.perf_counter() - dispatch_started)
      step += steps
      run.dispatched(step, metrics, steps)
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
    logging.error('%s.end after %s: %s',
                  type(hook).__name__,
                  type(error).__name__, e)
