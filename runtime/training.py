"""The data-parallel training loop that every training workload runs.

A workload describes its model and data as a `Task` and calls `train`, which
splits each step's global batch among processes and devices, prepares the
next batches while a step runs, runs the data-parallel step on the
parallelism that `config.parallelism` chooses, restores and saves
checkpoints, and runs the loop's hooks (runtime/hooks.py): logging to the
log, metrics.jsonl and TensorBoard, evaluation, checkpoints, the preemption
agreement, a profiler window and the task's own.

Example (a workload):
  >>> def train_and_evaluate(config: ConfigDict, workdir):
  ...   task = runtime.Task(
  ...       params=init_params(config), loss_fn=loss_fn,
  ...       optimizer=optax.adam(config.optimizer.learning_rate),
  ...       data=runtime.ArraySource(x=xs, label=labels))
  ...   return runtime.train(config, workdir, task)
"""

import dataclasses
import functools
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from absl import logging
import jax
from jax.experimental import multihost_utils
from ml_collections import ConfigDict
import numpy as np
import optax

from runtime import agreement
from runtime import batch_layout as batch_layout_lib
from runtime.checkpoints import batch_limit
from runtime.checkpoints import checkpoint
from runtime.checkpoints import checkpoint_meta
from runtime.common import deprecations
from runtime.common import exit_codes
from runtime.common import goodput
from runtime.common import layout
from runtime import config_reads
from runtime import coordination
from runtime import data as data_lib
from runtime import device_data
from runtime import dispatch
from runtime import evaluation
from runtime import fingerprint as fingerprint_lib
from runtime import flops as flops_lib
from runtime import hooks as hooks_lib
from runtime import integrity
from runtime.checkpoints import local_cadence
from runtime.checkpoints import local_checkpoint
from runtime import loop
from runtime import loss_scale as loss_scale_lib
from runtime import metrics as metrics_lib
from runtime import options as options_lib
from runtime import parallelism as parallelism_lib
from runtime.parallelism import microbatches
from runtime.parallelism import state_layout
from runtime import randomness
from runtime import readers as readers_lib
from runtime.checkpoints import recovery
from runtime import step as step_lib
from runtime import structure
from runtime import topology as topology_lib

NonFiniteLossError = loop.NonFiniteLossError


@dataclasses.dataclass(frozen=True)
class Task:
  """What a training workload hands to `train`.

  Attributes:
    params: initial parameters, a pytree of host arrays, identical on every
      process (draw them from the config's seed).
    loss_fn: `(params, batch[, rng]) -> (loss, metrics)` on one device's
      examples; with model_state, `(params, model_state, batch[, rng]) ->
      (loss, (metrics, new_model_state))`. loss and metrics are scalars.
    optimizer: an optax transformation.
    data: the training examples, random access: `len(data)` and
      `data[i] -> example` (a pytree of arrays), or `data.read_batch(ids)`
      for many at once (`runtime.data.ArraySource`); a grain `MapDataset`
      qualifies. The loop reads ids in the exactly-once order of
      runtime/data.py.
    model_state: the model's variables besides params that the forward pass
      updates, such as Flax's `batch_stats`; float leaves, kept identical on
      every device by a pmean after every step. None: the model has none.
    rng: pass loss_fn a last argument, a PRNG key, by one of two contracts
      (runtime/randomness.py). 'example': uint32 (n, 2), a key for each of
      its n examples, from the step and the example's position in the
      global batch, so an example draws the same numbers on any topology
      and microbatching (`runtime.dropout(rng, rate, x)` drops per
      example; `runtime.per_example` runs Flax's dropout layers per
      example). 'device': uint32 (2,), one key per call, what Flax's
      nnx.Dropout, linen's Dropout and jax.random take as they are; its
      draws change with the number of devices and microbatches. Either
      way the step's key comes from the checkpointed state, so a resumed
      run draws the same keys.
    loss_uses_rng: True is rng='device' (what it meant before rng existed).
    eval_fn: optional `(params, model_state) -> {name: value}`, run on
      every process every config.eval_every steps and at the end with the
      replicated state placed for the run's parallelism (`runtime.evaluate`
      scores a data source exactly); its results go to metrics.jsonl as
      eval_*.
    schedule: the optimiser's learning-rate schedule, `count -> rate`; when
      given, the rate is logged with the metrics.
    hooks: more hooks (runtime/hooks.py), called after the built-in ones.
    shard_dims: with config.state_layout='sharded', {leaf pattern:
      dimension, or None for whole} where the rule's choice will not do
      (runtime/parallelism/state_layout.py `specs`); config.shard_dims
      wins over it.
    flops_per_example: the model's FLOPs for one example, forward and
      backward (6 x parameters x tokens, plus attention, for a decoder);
      None: XLA's cost analysis of the compiled step counts them
      (runtime/flops.py). The step lines' TFLOP/s and MFU come from it.
    tokens_per_example: where examples are sequences, their length; the
      step lines then give tokens_per_sec.
    loss_scale: a dynamic loss scale for float16 (runtime/loss_scale.py,
      Flax's DynamicScale step for step): the loss is scaled before
      differentiating, a step whose gradients are not all finite is
      skipped (its non-finite loss then stops nothing) and the scale backs
      off; None: none.
    evaluate: the old name of `eval_fn`, kept for one release.
  """
  params: Any
  loss_fn: step_lib.LossFn
  optimizer: optax.GradientTransformation
  data: Any
  model_state: Any = None
  loss_uses_rng: bool = False
  rng: Optional[str] = None
  eval_fn: Optional[Callable[[Any, Any], dict[str, float]]] = None
  schedule: Optional[Callable[[int], Any]] = None
  hooks: Sequence[hooks_lib.Hook] = ()
  shard_dims: Optional[Mapping[str, Optional[int]]] = None
  flops_per_example: Optional[float] = None
  tokens_per_example: Optional[int] = None
  loss_scale: Optional[loss_scale_lib.DynamicScale] = None
  evaluate: Optional[Callable[[Any, Any], dict[str, float]]] = None

  def __post_init__(self):
    randomness.contract(self.rng, self.loss_uses_rng)  # Refuses a typo now.
    _check_data(self.data)
    if self.evaluate is not None:
      deprecations.warn('Task(evaluate=...)', stacklevel=4)
      if self.eval_fn is not None:
        raise ValueError('Task got both eval_fn and evaluate (its old name); '
                         'give eval_fn alone')
      object.__setattr__(self, 'eval_fn', self.evaluate)
      object.__setattr__(self, 'evaluate', None)

  def step_optimizer(self) -> optax.GradientTransformation:
    """The optimiser the step runs: `optimizer`, under the loss scale's
    wrapper where the task has one."""
    if self.loss_scale is None:
      return self.optimizer
    return loss_scale_lib.wrap(self.optimizer, self.loss_scale)


class DataSourceError(exit_codes.ConfigError):
  """Task.data is not a random-access source (exit 2)."""


def _check_data(data: Any) -> None:
  """Refuses a Task.data without `len` and random access, with the fix."""
  has_len = hasattr(type(data), '__len__')
  readable = (hasattr(type(data), '__getitem__') or
              callable(getattr(data, 'read_batch', None)))
  if has_len and readable:
    return
  missing = ' and '.join(n for n, ok in (('len(data)', has_len),
                                         ('data[i]', readable)) if not ok)
  raise DataSourceError(
      f'Task.data is {type(data).__module__}.{type(data).__name__}, which '
      f'has no {missing}. podrun reads examples by index, every one once '
      'an epoch in an order a resumed run continues exactly, so it needs '
      'len(data) and data[i] -> example (or data.read_batch(ids)); an '
      'iterator (a generator, tf.data, a tfds or grain iterator) has '
      'neither. Load the arrays into runtime.ArraySource(**arrays), or give '
      'a random-access source: a grain MapDataset (grain.MapDataset.source'
      '(...)) or any object with __len__ and __getitem__.')


@dataclasses.dataclass
class TrainResult:
  """What `train` returns, on every process.

  Attributes:
    final_metrics: the metrics of the last step this process ran ({} when
      it ran none).
    eval_metrics: the last evaluation's results, eval_*.
    fingerprint: of the final parameters; the same on every process.
    params: the final parameters, host numpy arrays.
    model_state: the final model state, host numpy arrays ({} for none).
    start_step: the step this run started from.
    steps: the step it ended at.
    extra: anything a workload adds for summary.json's results.
    topology: what computed the steps: num_processes, num_devices,
      microbatches.
    chip: the device kind, its peak, FLOPs per step and the run's TFLOP/s
      per device, MFU and tokens/s (runtime/flops.py `Figures.summary`).
    trained: False when the checkpoint was already at `steps` and this run
      trained nothing: the launcher then leaves the record (summary.json)
      as the run that trained wrote it.
  """
  final_metrics: dict[str, float]
  eval_metrics: dict[str, float]
  fingerprint: fingerprint_lib.Fingerprint
  params: Any
  model_state: Any
  start_step: int
  steps: int
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)
  topology: dict[str, int] = dataclasses.field(default_factory=dict)
  chip: dict[str, Any] = dataclasses.field(default_factory=dict)
  trained: bool = True

  def summary(self) -> dict[str, Any]:
    """The JSON-able part, for summary.json: no parameters."""
    out = {'fingerprint': self.fingerprint, 'start_step': self.start_step,
           'eval': self.eval_metrics, 'topology': self.topology,
           'chip': self.chip}
    if jax.tree_util.tree_leaves(self.model_state):
      out['model_state_fingerprint'] = fingerprint_lib.fingerprint(
          self.model_state)
    return {**out, **self.extra}


def max_steps_in_flight(configured: Optional[int], platform: str) -> int:
  """How many dispatched steps may be unfinished at once: `configured`
  (config.max_steps_in_flight) when set, else by platform.

  One on CPU: emulated CPU devices that queue several collective steps can
  deadlock in the all-reduce rendezvous when there are fewer cores than
  devices (BUILD_NOTES.md). Two elsewhere, enough to keep an accelerator busy
  while the host prepares the next batch.
  """
  if configured is not None:
    if configured < 1:
      raise ValueError(f'config.max_steps_in_flight={configured}; it must be '
                       'at least 1')
    return configured
  return 1 if platform == 'cpu' else 2


def _open_checkpoints(options: options_lib.Checkpointing, attempt: str):
  """(persistent tier, local tier); None for each that is off. The local
  copies name the attempt that wrote them."""
  if not options.enabled:
    return None, None
  ckpt = checkpoint.open_for(options)
  return ckpt, local_checkpoint.open_for(options.local, ckpt.path, attempt)


def _hooks(options: options_lib.TrainOptions, workdir: str, task: Task, topo,
           ckpt, local) -> list[hooks_lib.Hook]:
  """The built-in hooks, in the order they run, then the task's."""
  log = hooks_lib.LogMetrics(options.logging.every, task.schedule)
  describe = lambda run, numpy_state, reason: checkpoint_meta.describe_run(
      options.checkpointing, topo, len(task.data), run.step, numpy_state,
      reason)
  replicas = integrity.CheckReplicas(options.integrity_every,
                                     ckpt.all_steps if ckpt else lambda: [])
  # The saves run the replica check of their step first, and the local
  # tier's end waits for the persistent save: no order matters below.
  save = None
  if ckpt is not None:
    save = hooks_lib.SaveCheckpoints(ckpt, describe, checks=[replicas])
  built_in = [log, hooks_lib.PreemptionAgreement(log, save), replicas]
  if local is not None:
    built_in.append(hooks_lib.SaveLocalCheckpoints(local, ckpt, describe,
                                                   checks=[replicas]))
  if save is not None:
    built_in.append(save)
  if task.eval_fn is not None:
    built_in.append(hooks_lib.PeriodicEvaluation(options.eval_every,
                                                 task.eval_fn))
  if options.logging.profile_steps:
    built_in.append(hooks_lib.Profile(
        layout.Record(workdir).tensorboard(), options.logging.profile_start,
        options.logging.profile_steps))
  return built_in + list(task.hooks)


class _Programs:
  """The compiled step for each number of steps per call, built on first
  use: each agreed on by every process before its first run and watched for
  late recompilations. Only the one-step program's FLOPs are measured (XLA's
  cost analysis counts a scan's body once)."""

  def __init__(self, task: Task, par, batch_layout: microbatches.Layout,
               placed: Optional[step_lib.TrainState] = None):
    self._task, self._par, self._batch_layout = task, par, batch_layout
    self._placed = placed
    self._built: dict[int, Callable] = {}
    self._measured: Optional[flops_lib.Measured] = None
    contract = randomness.contract(task.rng, task.loss_uses_rng)
    if contract == randomness.DEVICE and jax.process_index() == 0:
      logging.warning(
          'Task(%s): loss_fn gets one key per call, so its dropout changes '
          'with the number of devices and microbatches. For the same step on '
          'any layout, Task(rng=\'example\') gives a key per example: '
          'runtime.dropout(rng, rate, x), or Flax\'s dropout layers under '
          'runtime.per_example (docs/workloads.md, Randomness)',
          'rng=\'device\'' if task.rng else 'loss_uses_rng=True')
    self._contract = contract

  def flops_per_device(self) -> Optional[float]:
    """One step's FLOPs per device, once the one-step program has run."""
    return None if self._measured is None else self._measured.flops_per_device

  def memory(self) -> dict[str, int]:
    """The one-step program's bytes per device (runtime/memory.py), once
    it has run; {} where unknown."""
    known = self._measured is not None and self._measured.memory is not None
    return self._measured.memory.as_dict() if known else {}

  def __call__(self, steps: int) -> Callable:
    if steps not in self._built:
      self._built[steps] = self._build(steps)
    return self._built[steps]

  def _build(self, steps: int) -> Callable:
    task, has_model_state = self._task, self._task.model_state is not None
    scaled = task.loss_scale is not None
    if self._placed is None:
      step = step_lib.make_train_step(
          task.loss_fn, task.step_optimizer(), self._par, rng=self._contract,
          has_model_state=has_model_state, layout=self._batch_layout,
          steps=steps, loss_scale=scaled)
    else:
      step = step_lib.make_sharded_train_step(
          task.loss_fn, task.step_optimizer(), self._placed,
          rng=self._contract, has_model_state=has_model_state,
          layout=self._batch_layout, steps=steps, loss_scale=scaled)
    if steps == 1:
      step = self._measured = flops_lib.Measured(step)
    stage = 'program' if steps == 1 else f'program_{steps}_steps'
    name = 'the train step' if steps == 1 else f'the {steps}-step call'
    return structure.RecompileWatch(agreement.check_program_on_first_call(
        step, coordination.current(), stage), name)


def _cadences(options: options_lib.TrainOptions, task: Task) -> dict[str, int]:
  """Every cadence in steps the loop keeps, by its config name (0: none):
  what steps_per_dispatch must divide."""
  checkpointing = options.checkpointing
  local = checkpointing.local
  cadences = {
      'log_every': options.logging.every,
      'eval_every': options.eval_every if task.eval_fn is not None else 0,
      'integrity_every': options.integrity_every,
      'checkpoint_every': checkpointing.every if checkpointing.enabled else 0,
      # The default cadence copies at the first dispatch at or after its
      # step: any k fits it.
      'local_checkpoint_every': (
          local.every_steps if checkpointing.enabled and not local.every_s
          and not local.budgeted else 0),
  }
  if options.logging.profile_steps:
    cadences['profile.start_step'] = options.logging.profile_start
    cadences['profile.num_steps'] = options.logging.profile_steps
  for hook in task.hooks:
    if isinstance(hook, hooks_lib.Periodic):
      cadences[f'Task.hooks {type(hook).__name__}(every)'] = hook.every
  return cadences


def _step_bytes(task: Task, rows: int) -> int:
  """The bytes of `rows` examples: one step's batch on one host."""
  example = data_lib.first_example(task.data)
  return rows * sum(np.asarray(x).nbytes
                    for x in jax.tree_util.tree_leaves(example))


def _steps_per_dispatch(options: options_lib.TrainOptions, task: Task,
                        platform: str, rows_per_process: int
                        ) -> tuple[Optional[int], dispatch.Auto]:
  """(k, or None to measure first; what decides k after measuring), for
  hosts that place `rows_per_process` rows a step (none where the data set
  is on the devices).

  Raises:
    DispatchError: for a k that a cadence is not a multiple of.
  """
  cadences = _cadences(options, task)
  decide = dispatch.Auto(
      cadences, platform, lambda last: local_cadence.recent_step_s(last),
      coordination.current(),
      lambda: 0 if options.data.on_device else _step_bytes(
          task, rows_per_process))
  k = options.steps_per_dispatch
  if k is not None:
    dispatch.check_cadences(k, cadences)
    return k, decide
  others = [type(h).__name__ for h in task.hooks
            if not isinstance(h, hooks_lib.Periodic)]
  if platform == 'cpu' or others:
    if others and jax.process_index() == 0:
      logging.info('steps_per_dispatch=auto: one step per call, since the '
                   'task\'s hooks %s are called after every step', others)
    return 1, decide
  return None, decide


_REPLICA_WORDS = {'process': 'one per process', 'slice': 'one per slice',
                  'all': 'every device'}


def _shardings(config: ConfigDict, state: step_lib.TrainState,
               task_dims: Optional[Mapping[str, Optional[int]]],
               elastic: Optional[tuple[int, int]]
               ) -> tuple[Optional[step_lib.TrainState], str]:
  """(the state's shardings, or None to replicate it; the console's line
  on where the state lives), in a job of a fixed size or of `elastic`'s
  (fewest, most) processes."""
  replica = state_layout.replica_of(config, elastic)
  if replica is None:
    return None, ''
  grid = state_layout.mesh(replica)
  shards = grid.shape[state_layout.SHARD_AXIS]
  # The config's patterns first: the first that names a leaf wins.
  from_config = state_layout.parse_dims(config.get('shard_dims', ''))
  overrides = {**from_config, **{k: v for k, v in (task_dims or {}).items()
                                 if k not in from_config}}
  specs = state_layout.specs(state, shards, overrides)
  used = state_layout.footprint(state, specs, shards)
  return step_lib.state_shardings(grid, specs), (
      f'state sharded: {grid.shape[state_layout.REPLICA_AXIS]} replica(s) '
      f'({_REPLICA_WORDS[replica]}) of {shards} device(s); '
      f'{used.describe()}')


def train(config: ConfigDict, workdir: str, task: Task) -> TrainResult:
  """Trains `task` to step `config.steps` on every device of the job.

  Resumes from the newest copy of the state anywhere in the job, local or
  persistent (config.restore; runtime/checkpoints/recovery.py), saves every
  config.checkpoint_every steps and at the end, keeps a local copy on every
  process every config.local_checkpoint_every steps, and on a preemption
  notice saves the step every process agreed on and raises `Preempted`.

  Args:
    config: a config made from runtime/config_base.py.
    workdir: where metrics.jsonl and tensorboard/ (process 0),
      ranks/rank_<i>.json and, by default, checkpoints/ go.
    task: the model and data.

  Returns:
    A TrainResult, the same on every process but for final_metrics' timing.

  Raises:
    BatchSizeError: when the global batch does not divide over the devices.
    NonFiniteLossError: naming the step whose loss is not finite.
    CheckpointError: when the checkpoint cannot be used, or its directory is
      not shared by every process.
    Preempted: after saving, on a preemption notice.
  """
  ledger = goodput.current()
  ledger.name_since('workload', 'workload_setup')
  with ledger.naming('train_setup'):
    options = options_lib.TrainOptions.of(config, workdir)
    topo = topology_lib.current()
    options, data_why = _data_on_device(options, task, topo.platform)
    in_flight_limit = max_steps_in_flight(options.max_steps_in_flight,
                                          topo.platform)
    par = parallelism_lib.from_config(config)
    state = step_lib.init_state(task.params, task.step_optimizer(),
                                options.data.seed, task.model_state)
    placed, where = _shardings(config, state, task.shard_dims,
                               options.elastic)
    batch_layout = _choose_layout(config, topo, workdir, task, state, options,
                                  par.axis if placed is None else
                                  parallelism_lib.DATA_AXIS)
    rows, _ = microbatches.process_positions(
        batch_layout, topo.process_index, topo.local_device_count)
    per_dispatch, decide = _steps_per_dispatch(
        options, task, topo.platform, rows.stop - rows.start)
    programs = _Programs(task, par, batch_layout, placed)
    figures = flops_lib.Figures(
        topo.device_kind, batch_layout.num_devices, programs.flops_per_device,
        options.data.global_batch_size, task.tokens_per_example,
        task.flops_per_example)
  ledger.note(topology=layout_fields(topo, batch_layout))
  restore_started = time.perf_counter()
  with ledger.timing('checkpoint_restore'):
    ckpt, local = _open_checkpoints(options.checkpointing, options.attempt)
    start, state, tier = recovery.restore(options.checkpointing, ckpt, local,
                                          state, len(task.data), placed)
  _note_restore(ledger, local, tier, state,
                time.perf_counter() - restore_started)
  if start:
    _say_where_it_resumes(ckpt, start, topo)
  if start >= options.steps:
    return _nothing_to_train(options, workdir, start, state, batch_layout,
                             topo)
  with ledger.naming('metrics_writer'):
    writer = metrics_lib.MetricsWriter(
        workdir, topo.process_index == 0, resume_step=start or None,
        tensorboard_events=options.logging.tensorboard,
        fields=layout_fields(topo, batch_layout))
  with ledger.naming('replicate'):
    replicated = (par.replicate(state) if placed is None else
                  state_layout.place(state, placed))
  clock = goodput.StepClock(ledger, goodput.steps_done_before(ledger))
  run = loop.Run(options, workdir, task, replicated, start, par,
                 topo.process_index, writer, clock, in_flight_limit,
                 config=config, placed=placed, figures=figures)
  if topo.process_index == 0:
    _remember_layout_once(run, config, workdir, batch_layout)
  resumed = f', resuming at step {start}' if start else ''
  per_call = ('steps_per_dispatch=auto' if per_dispatch is None else
              f'{per_dispatch} step(s) per call')
  where_data = ('the data set on the devices' if options.data.on_device
                else 'batches from the host') + (f' ({data_why})' if data_why
                                                 else '')
  writer.log(f'training {options.steps} steps, global batch '
             f'{options.data.global_batch_size} ({batch_layout.describe()}), '
             f'{par}, {per_call}, {in_flight_limit} call(s) in flight, '
             f'{where_data}, on {topo.describe()}{resumed}')
  if where:
    writer.log(where)
  # The end of set-up: another trainer's names that nothing read are refused,
  # and the evaluation's contract is checked by tracing it.
  config_reads.check(config)
  if task.eval_fn is not None:
    with ledger.naming('eval_check'):
      evaluation.check_eval_fn(task.eval_fn, replicated.params,
                               replicated.model_state)
  readers = (None if options.data.on_device else readers_lib.start(
      task.data, options.data.workers, rows.stop - rows.start,
      coordination.current()))
  try:
    with dispatch.Dispatches(
        _loader(options.data, task, topo, par, batch_layout, readers), start,
        options.steps, per_dispatch, decide,
        size=options.data.prefetch) as dispatches:
      loop.run_steps(run, programs, dispatches.next,
                     _hooks(options, workdir, task, topo, ckpt, local))
  finally:
    if readers is not None:
      readers.close()
    clock.close()
    with ledger.naming('results'):
      writer.close()
  config_reads.finish(config)
  with ledger.naming('results'):
    _log_final_metrics(run, writer)
    result = _result(run, topo, workdir)
  result.topology = layout_fields(topo, batch_layout)
  result.chip = figures.summary(figures.mean_steps_per_sec())
  if programs.memory():
    result.chip['step_memory'] = programs.memory()
  return result


def _data_on_device(options: options_lib.TrainOptions, task: Task,
                    platform: str) -> tuple[options_lib.TrainOptions, str]:
  """The options with config.data.on_device decided where the config left
  it unset (runtime/device_data.py `choose`), and why ('' where set)."""
  if options.data.on_device is not None:
    return options, ''
  chosen, why = device_data.choose(task.data, platform,
                                   jax.local_devices()[0].memory_stats())
  return dataclasses.replace(options, data=dataclasses.replace(
      options.data, on_device=chosen)), why


def _note_restore(ledger: goodput.Ledger, local, tier: str,
                  state: step_lib.TrainState, seconds: float) -> None:
  """Notes what the restore read and in how long, and tells the local
  tier's cadence what a hard failure costs (runtime/checkpoints/
  local_cadence.py): this restore's seconds and the job's failures so
  far."""
  if tier != 'fresh':
    size = sum(getattr(x, 'nbytes', 0) for x in jax.tree_util.tree_leaves(
        state))
    ledger.note(restore_bytes=int(size), restore_s=seconds)
    if jax.process_index() == 0:
      logging.info('restored %.2f GB from the %s tier in %.2f s (%.2f GB/s)',
                   size / 1e9, tier, seconds, size / 1e9 / max(seconds, 1e-9))
  if local is None:
    return
  failures, run_s = goodput.failure_history(ledger)
  mtbf = (run_s / failures, f'{failures} hard failure(s) in {run_s:.0f} s '
          'of this job') if failures else (None, 'default')
  local.cadence.knows_fault_cost(seconds if tier != 'fresh' else 0.0, *mtbf)

  def chosen(interval):
    # Written at once: a hard failure is what the record is read after.
    ledger.note(local_interval=interval.as_dict())
    ledger.flush(force=True)
  local.cadence.on_chosen = chosen


def _choose_layout(config: ConfigDict, topo, workdir: str, task: Task,
                   state: step_lib.TrainState,
                   options: options_lib.TrainOptions,
                   axis: Any) -> microbatches.Layout:
  """runtime/batch_layout.py's choice for this job, with the task's loss
  read for collectives over `axis` where a layout would pad."""
  mixing = batch_layout_lib.loss_mixing(
      task.loss_fn, randomness.contract(task.rng, task.loss_uses_rng),
      task.model_state is not None, state, task.data, axis,
      topo.process_count * topo.local_device_count)
  return batch_layout_lib.choose(config, topo, workdir,
                                 task.model_state is not None,
                                 options.elastic, mixing, axis)


def _remember_layout_once(run: loop.Run, config: ConfigDict, workdir: str,
                          chosen: microbatches.Layout) -> None:
  """Keeps the group size for later attempts once the first call has run
  (runtime/checkpoints/batch_limit.py): a run refused before step 1 leaves
  nothing behind."""
  done = []

  def first(_):
    if not done:
      done.append(True)
      batch_limit.remember(config, workdir, chosen)
  run.on_retired.append(first)


def _say_where_it_resumes(ckpt, start: int, topo) -> None:
  """One line where the checkpoint was saved on another topology. Every
  process reads the meta (orbax's restore is collective); process 0 says."""
  if ckpt is None or start not in ckpt.all_steps():
    return
  try:
    saved = ckpt.meta(start).get('saved_by', {})
  except Exception:  # pylint: disable=broad-except
    return  # An older checkpoint's meta: nothing to compare.
  then = (saved.get('process_count'), saved.get('device_count'))
  now = (topo.process_count, topo.global_device_count)
  if then != now and None not in then and topo.process_index == 0:
    logging.info('the checkpoint of step %d was saved by %d process(es) on %d '
                 'device(s); this run resumes it on %d process(es), %d '
                 'device(s), with the same global batch', start, *then, *now)


def _nothing_to_train(options: options_lib.TrainOptions, workdir: str, start: int,
                      state: step_lib.TrainState, batch_layout, topo
                      ) -> TrainResult:
  """The TrainResult of a run whose checkpoint is already at its last
  step: it says so, trains and evaluates nothing, and marks the result
  untrained so that the record stays the trained run's."""
  if topo.process_index == 0:
    logging.warning(
        'nothing to train: the checkpoint in %s is already at step %d of '
        'config.steps=%d. This run trains nothing and leaves summary.json as '
        'the run that trained wrote it. To train again from step 0, give '
        'another --workdir; to train further, raise --config.steps.',
        options.checkpointing.directory or workdir, start, options.steps)
  if any(isinstance(leaf, jax.Array) and not leaf.is_fully_addressable
         for leaf in jax.tree_util.tree_leaves(state)):
    # A sharded state restored across processes: every process runs this.
    host = multihost_utils.process_allgather(state, tiled=True)
  else:
    host = jax.device_get(state)
  return TrainResult(final_metrics={}, eval_metrics={},
                     fingerprint=fingerprint_lib.fingerprint(host.params),
                     params=host.params, model_state=host.model_state,
                     start_step=start, steps=options.steps,
                     topology=layout_fields(topo, batch_layout), trained=False)


def _log_final_metrics(run: loop.Run, writer: metrics_lib.MetricsWriter
                       ) -> None:
  """Says what final_metrics are, since they differ from the last line."""
  if run.last_metrics:
    values = ' '.join(f'{k}={v:g}' for k, v in sorted(run.last_metrics.items()))
    writer.log(f'final_metrics, of step {run.step} alone: {values} (each '
               f'step line above is a mean over up to log_every='
               f'{run.options.logging.every} steps)')


def layout_fields(topo, batch_layout: microbatches.Layout) -> dict[str, int]:
  """What every metrics row says of the topology that computed it."""
  return {'num_processes': topo.process_count,
          'num_devices': batch_layout.num_devices,
          'microbatches': batch_layout.microbatches}


def _loader(data: options_lib.Data, task: Task, topo, par,
            batch_layout: microbatches.Layout,
            readers: Optional[Any] = None
            ) -> Callable[[int, int], Any]:
  """(step, steps) -> this process's part of the batches of the steps after
  `step`, on its devices, for one call (runtime/dispatch.py `stack`): its
  real examples of each step, then zero rows where the batch layout pads;
  read by `readers` where given (config.data.workers)."""
  rows, real = microbatches.process_positions(
      batch_layout, topo.process_index, topo.local_device_count)
  devices = topo.local_device_count

  def ids_of(step: int, steps: int) -> np.ndarray:
    """(steps, real) ids: this process's real examples of each step."""
    return data_lib.steps_batch_ids(
        step, steps, data.global_batch_size, len(task.data), data.seed,
        data.shuffle)[:, rows.start:rows.start + real]

  if data.on_device:
    gather = device_data.Gather(par, task.data)

    def on_device(step: int, steps: int):
      # The host path's order, padding rows included (ids past the end).
      ids = np.full((steps, rows.stop - rows.start), gather.padding_id)
      ids[:, :real] = ids_of(step, steps)
      return gather(ids.reshape(steps, devices, -1).swapaxes(0, 1).reshape(-1))
    return on_device

  read = readers.read if readers is not None else functools.partial(
      data_lib.read_batch, task.data)

  def load(step: int, steps: int):
    ids = ids_of(step, steps)
    if real == rows.stop - rows.start and real % devices == 0:
      # No padding: one read of every step's examples, already in the
      # order `stack` would give (device by device, each device's rows step
      # by step), so the host copies the call's batch once, not twice.
      order = ids.reshape(steps, devices, -1).swapaxes(0, 1).reshape(-1)
      return par.put_batch(read(order))
    return par.put_batch(dispatch.stack(
        [data_lib.padded(read(one), rows.stop - rows.start) for one in ids],
        devices))
  return load


def _result(run: loop.Run, topo, workdir: str) -> TrainResult:
  """The TrainResult; also writes ranks/rank_<i>.json for comparison."""
  host = run.numpy_state()
  fingerprint = fingerprint_lib.fingerprint(host.params)
  metrics_lib.write_json(
      layout.Record(workdir).result(topo.process_index), {
          'process_index': topo.process_index,
          'process_count': topo.process_count,
          'local_devices': [str(d) for d in jax.local_devices()],
          'steps': run.steps,
          'start_step': run.start_step,
          'fingerprint': fingerprint,
      })
  return TrainResult(final_metrics=run.last_metrics,
                     eval_metrics=run.eval_metrics, fingerprint=fingerprint,
                     params=host.params, model_state=host.model_state,
                     start_step=run.start_step, steps=run.steps)
