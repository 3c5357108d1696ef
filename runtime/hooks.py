"""What the training loop does now and then: one interface, one small class each.

The loop (runtime/loop.py) calls every hook after every step; a hook decides
by itself whether it is due, from `run.step`, the number of steps done. Due
steps are multiples of a cadence, so a resumed run keeps the cadence of the
run it continues. Built in: logging, the preemption agreement, checkpoints,
evaluation and a profiler window; a task adds its own through `Task.hooks`.

Example (a hook of one's own):
  >>> class PrintNorm(hooks.Periodic):
  ...   def __init__(self):
  ...     super().__init__(every=100)
  ...   def work(self, run):
  ...     params = run.numpy_state().params
  ...     print(run.step, optax.global_norm(params))
"""

import time
from typing import Callable, Optional, Sequence

from absl import logging
import jax
import jax.numpy as jnp

from runtime.checkpoints import checkpoint
from runtime import compile_events
from runtime.common import deprecations
from runtime.common import exit_codes
from runtime.common import progress
from runtime import coordination
from runtime import metrics as metrics_lib
from runtime import preemption

# How long a process that fails waits for the checkpoint it is writing.
_FINISH_ON_ERROR_S = 30.0


class Hook:
  """The interface. Each method has a default that does nothing.

  `begin(run)` once before the first step; `after_step(run)` after every
  step, with `run.state` the state after step `run.step`; `end(run, error)`
  once when the loop stops, `error` None when it reached `run.steps`, else
  the exception that stops it (an `end` must not raise then).
  """

  def begin(self, run) -> None:
    pass

  def after_step(self, run) -> None:
    pass

  def end(self, run, error: Optional[BaseException]) -> None:
    pass

  def cadences(self) -> dict[str, int]:
    """The steps this hook must see, as {the name a user sets them by:
    every so many steps} (0: none): a call of several steps
    (config.steps_per_dispatch) must end on each. {} for a hook that is
    called after every call and keeps no cadence."""
    return {}


def cadences(hooks: Sequence[Hook]) -> dict[str, int]:
  """Every hook's cadences together: what steps per call must divide. A
  hook of the task's own that is no `Hook` (its three methods alone) keeps
  none."""
  out: dict[str, int] = {}
  for hook in hooks:
    if callable(getattr(hook, 'cadences', None)):
      out.update(hook.cadences())
  return out


class Periodic(Hook):
  """A hook whose `work(run)` is due every `every` steps (0: never), and after
  the last step too when `at_end`.

  Example:
    >>> hooks.Periodic(every=500, callback=lambda run: save_samples(run))
  """

  def __init__(self,
               every: int,
               callback: Optional[Callable] = None,
               at_end: bool = False):
    if every < 0:
      raise ValueError(f'every={every}; use a positive step count, or 0 for '
                       'never')
    self.every, self.at_end, self._callback = every, at_end, callback
    self._done_at: Optional[int] = None

  # What a user sets `every` by, in a cadence's refusal; None: the hook's
  # class, as one of Task.hooks.
  every_name: Optional[str] = None

  def cadences(self) -> dict[str, int]:
    name = self.every_name or f'Task.hooks {type(self).__name__}(every)'
    return {name: self.every}

  def due(self, run) -> bool:
    return bool((self.every and run.step % self.every == 0) or
                (self.at_end and run.final))

  def after_step(self, run) -> None:
    self.ensure_done(run)

  def ensure_done(self, run) -> None:
    """Does the work of step `run.step` if it is due and not done yet.

    A hook that must run before another at the same step (the replica check
    before a save) is called through this by the other, so that the order
    of the hooks does not matter.
    """
    if self.due(run) and getattr(self, '_done_at', None) != run.step:
      self._done_at = run.step
      self.work(run)

  def work(self, run) -> None:
    """The work itself; by default calls the `callback` given."""
    if type(self).run is not Periodic.run:
      deprecations.warn('Periodic.run', hook=type(self).__name__)
      self.run(run)
      return
    if self._callback is None:
      raise NotImplementedError(
          f'{type(self).__name__} gives neither work(run) nor a callback')
    self._callback(run)

  def run(self, run) -> None:
    """Deprecated: the old name of `work`, kept for one release."""
    self.work(run)


def learning_rate(schedule: Callable, step: int) -> float:
  """The rate the last step used, called as optax calls a schedule: with
  the count of updates before it (from 0), an int32 array.

  Raises:
    ConfigError: naming the schedule and the count where it fails.
  """
  count = jnp.asarray(step - 1, jnp.int32)
  try:
    return float(schedule(count))
  except Exception as e:  # pylint: disable=broad-except
    name = getattr(schedule, '__qualname__', None) or repr(schedule)
    raise exit_codes.ConfigError(
        f'Task.schedule {name} failed at count {step - 1} (an int32 array, '
        f'as optax passes it), logging step {step}\'s learning rate: '
        f'{type(e).__name__}: {e}. Fix the schedule, or leave '
        'Task.schedule unset to log no rate.') from e


class LogMetrics(Periodic):
  """Every `every` steps and at the end: the means of the metrics since the
  last record, the speed and the input wait, what the chip does
  (tflops_per_device, mfu, tokens_per_sec: runtime/flops.py), to the log,
  metrics.jsonl and TensorBoard; the learning rate too when the task gives
  its schedule."""
  every_name = 'log_every'

  def __init__(self, every: int, schedule: Optional[Callable] = None):
    super().__init__(every, at_end=True)
    self.schedule = schedule
    self._described = False

  def begin(self, run) -> None:
    run.on_retired.append(lambda step: self._retired(run, step))

  def after_step(self, run) -> None:
    """Nothing: a record is written when its step's metrics are in
    (`_retired`), so that logging never waits for the device."""

  def _retired(self, run, step: int) -> None:
    if (self.every and step % self.every == 0) or step == run.steps:
      self._write(run, step)

  def work(self, run) -> None:
    """Writes the record of every step dispatched so far (waits for them)."""
    run.drain()
    self._write(run, run.step)

  def _write(self, run, step: int) -> None:
    if not run.window.steps:
      return
    rates = run.window.rates(run.options.data.global_batch_size)
    if rates and run.figures is not None:
      run.figures.count(run.window.timed_steps,
                        run.window.timed_steps / rates['steps_per_sec'])
      rates.update(run.figures.rates(rates['steps_per_sec']))
      if not self._described:
        self._described = True
        run.writer.log(run.figures.describe())
    prefix = run.options.logging.metrics_prefix
    record = {**{prefix + k: v for k, v in run.window.means().items()}, **rates}
    if self.schedule is not None:
      record[prefix + 'learning_rate'] = learning_rate(self.schedule, step)
    run.writer.write(step, record)
    speed = record.get('steps_per_sec')
    eta = '' if speed is None else ' eta=' + metrics_lib.format_duration(
        (run.steps - step) / max(speed, 1e-9))
    shown = ' '.join(f'{k}={v:.6g}' for k, v in record.items())
    run.writer.log(f'step {step}/{run.steps} {shown}{eta}')
    run.window.reset()


class PeriodicEvaluation(Periodic):
  """Every `every` steps and at the end: `eval_fn(params, model_state)` on
  every process; its results go to metrics.jsonl as eval_* and to
  `run.eval_metrics`."""
  every_name = 'eval_every'

  def __init__(self, every: int, eval_fn: Callable):
    super().__init__(every, at_end=True)
    self.eval_fn = eval_fn
    self.last_step = None

  def work(self, run) -> None:
    run.drain()
    started = time.perf_counter()
    with run.clock.timing('evaluation'), progress.working('evaluation'):
      values = self.eval_fn(run.state.params, run.state.model_state)
    run.eval_metrics = {f'eval_{k}': v for k, v in values.items()}
    record = {**run.eval_metrics, 'eval_seconds': time.perf_counter() - started}
    run.writer.write(run.step, record)
    run.writer.log(f'eval at step {run.step}: ' +
                   ' '.join(f'{k}={v:.6g}' for k, v in record.items()))
    self.last_step = run.step

  def end(self, run, error) -> None:
    # A run resumed at its last step evaluates what it restored.
    if error is None and self.last_step != run.step:
      self.work(run)


class Profile(Hook):
  """A profiler trace of steps (start, start + num_steps] into
  WORKDIR/tensorboard, which TensorBoard's profile tab reads.

  Every process traces its own devices. The trace starts after step `start`
  and stops once step start + num_steps has finished.
  """

  def __init__(self, logdir: str, start: int, num_steps: int):
    self.logdir, self.start, self.stop = logdir, start, start + num_steps
    self.active = False

  def cadences(self) -> dict[str, int]:
    return {
        'profile.start_step': self.start,
        'profile.num_steps': self.stop - self.start
    }

  def begin(self, run) -> None:
    if run.start_step == self.start and self.stop > self.start:
      self._start(run)

  def after_step(self, run) -> None:
    if run.step == self.start and self.stop > self.start:
      self._start(run)
    elif self.active and run.step >= self.stop:
      self._stop(run)

  def end(self, run, error) -> None:
    if self.active:
      self._stop(run)

  def _start(self, run) -> None:
    jax.profiler.start_trace(self.logdir)
    self.active = True
    run.writer.log(f'profiling steps {self.start + 1} to {self.stop} into '
                   f'{self.logdir}')

  def _stop(self, run) -> None:
    jax.block_until_ready(run.state)
    jax.profiler.stop_trace()
    self.active = False
    logging.info('profile of steps %d to %d written', self.start + 1, run.step)


class SaveCheckpoints(Hook):
  """Every `checkpoints.every` steps and after the last: the state, and what
  resuming it needs to check (`describe(run, numpy_state, reason)`).

  `checks` (the replica check) are done for the step before it is saved,
  whatever the order of the hooks: no checkpoint of diverged replicas.
  """

  def __init__(self,
               checkpoints: checkpoint.Checkpoints,
               describe: Callable[..., dict],
               checks: Sequence[Periodic] = ()):
    self.checkpoints, self.describe = checkpoints, describe
    self.checks = tuple(checks)

  def cadences(self) -> dict[str, int]:
    return {'checkpoint_every': self.checkpoints.every}

  def after_step(self, run) -> None:
    if run.final:
      self.save(run, 'final')
    elif self.checkpoints.due(run.step):
      self.save(run, 'periodic')

  def save(self, run, reason: str) -> None:
    """Starts saving the state after step `run.step`; returns once it is on
    the host."""
    for check in self.checks:
      check.ensure_done(run)
    with (run.clock.timing('checkpoint_blocking'),
          progress.working('checkpoint',
                           self.checkpoints.describe_save(run.step))):
      # Every record up to this step is on disk before its checkpoint is:
      # a run resumed from it then misses none (metrics.py). The drain
      # writes this step's record (LogMetrics writes as steps retire).
      run.drain()
      run.writer.flush()
      saved = run.saved_state()
      self.checkpoints.save(run.step, saved, self.describe(run, saved, reason))

  def save_and_wait(self, run, reason: str) -> None:
    """Saves the state after step `run.step` and returns once it is
    complete on disk (the preemption save)."""
    self.save(run, reason)
    self.checkpoints.wait()

  def end(self, run, error) -> None:
    if error is None:
      with run.clock.timing('checkpoint_blocking'):
        self.checkpoints.close()
    elif jax.process_count() == 1:
      # A single process finishes the saves it started.
      try:
        self.checkpoints.close()
      except Exception as e:  # pylint: disable=broad-except
        logging.error('could not finish the checkpoint being written: %s', e)
    elif not self.checkpoints.finish(_FINISH_ON_ERROR_S):
      # With several processes another may be gone, and a save that needs
      # all of them would hang: it gets a bounded wait. (This process's own
      # error comes first; the others learn of it only after this.)
      logging.error(
          'the checkpoint being written did not complete within '
          '%g s of this error; the job resumes from the one before',
          _FINISH_ON_ERROR_S)


class SaveLocalCheckpoints(Hook):
  """At the steps of `local.cadence` (runtime/checkpoints/local_cadence.py): this process's own copy of the state, in its
  local tier (runtime/checkpoints/local_checkpoint.py); removed when the run
  ends well, once the persistent tier's final save is complete.

  Skips the steps the persistent tier saves anyway; `checks` as for
  SaveCheckpoints.
  """

  def __init__(self,
               local,
               persistent: Optional[checkpoint.Checkpoints],
               describe: Callable[..., dict],
               checks: Sequence[Periodic] = ()):
    self.local, self.persistent, self.describe = local, persistent, describe
    self.checks = tuple(checks)

  def cadences(self) -> dict[str, int]:
    # A cadence in seconds, or the default's budget, copies at the first
    # call that ends at or after its step: any steps per call fit it.
    cadence = self.local.cadence
    fixed = not cadence.in_seconds and not cadence.budgeted
    return {'local_checkpoint_every': cadence.every_steps if fixed else 0}

  def after_step(self, run) -> None:
    cadence = self.local.cadence
    if (not cadence.due(run.step, run.count) or run.final or
        (self.persistent is not None and self.persistent.due(run.step))):
      return
    cadence.saved(run.step, self._copy(run, 'local'))

  def copy_and_wait(self, run) -> None:
    """A copy of step `run.step` off the cadence, complete on return: the
    step a preemption (or a stop to grow) saves. The next attempt restores
    it from this tier, and a process that joins takes it from a peer that
    holds it (runtime/checkpoints/recovery.py), not from the persistent
    tier."""
    self._copy(run, 'preemption')
    self.local.wait()

  def _copy(self, run, reason: str) -> float:
    """Starts this process's copy of step `run.step`; returns the seconds
    it blocked the loop."""
    for check in self.checks:
      check.ensure_done(run)
    compiled = compile_events.seconds_in_this_thread()
    with (run.clock.timing('checkpoint_blocking'),
          progress.working('local_checkpoint')):
      run.drain()
      drained = time.perf_counter()
      run.writer.flush()
      kept = run.local_state_later()
      # The whole state's shapes, also when this copy is a part of it.
      meta = self.describe(run, run.state, reason)
      if run.part is not None:
        meta['part'] = run.part
      self.local.save(run.step, kept, meta)
    # What the copy cost the loop: not the steps drained (the device's
    # work, waited for anyway) nor the copy program's one compilation.
    blocking = (time.perf_counter() - drained -
                (compile_events.seconds_in_this_thread() - compiled))
    return max(blocking, 0.0)

  def end(self, run, error) -> None:
    if error is None and self._final_save_complete():
      self.local.remove()
    else:
      self.local.wait()

  def _final_save_complete(self) -> bool:
    """Waits for the persistent tier; False when its save failed (the copies
    stay; SaveCheckpoints.end reports the error)."""
    if self.persistent is None:
      return True
    try:
      self.persistent.wait()
    except Exception:  # pylint: disable=broad-except
      return False
    return True


class PreemptionAgreement(Hook):
  """Stops every process after the same step when one gets a preemption
  notice: logs the metrics so far, saves that step, waits until every
  process has, and raises `Preempted`."""

  def __init__(self,
               log: LogMetrics,
               checkpoints: Optional[SaveCheckpoints],
               local: Optional['SaveLocalCheckpoints'] = None):
    self.log, self.checkpoints, self.local = log, checkpoints, local
    self.notice = preemption.Notice()

  def begin(self, run) -> None:
    self.notice.__enter__()

  def after_step(self, run) -> None:
    # Every process asks after every call, with the same count: the
    # agreement is a collective of its own.
    if not self.notice.reached(run.dispatches) or run.final:
      return
    logging.warning(
        'preemption notice: every process saves step %d and '
        'stops', run.step)
    self.log.work(run)
    with (run.clock.timing('preemption_save'),
          progress.working('preemption_save')):
      if self.checkpoints is not None:
        self.checkpoints.save_and_wait(run, 'preemption')
      if self.local is not None:
        self._copy_locally(run)
      client = coordination.current()
      if client is not None and client.process_count > 1:
        client.barrier('podrun/preempted')
    raise preemption.Preempted(run.step)

  def _copy_locally(self, run) -> None:
    # After the persistent save, which alone must complete: a copy that
    # fails costs the next attempt only a slower restore.
    assert self.local is not None
    try:
      self.local.copy_and_wait(run)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning(
          'the local copy of step %d failed (%s: %s); the next '
          'attempt restores the persistent save', run.step,
          type(e).__name__, e)

  def end(self, run, error) -> None:
    self.notice.__exit__(None, None, None)
