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
import time
from typing import Any, Optional

from absl import logging
import jax
from jax.experimental import multihost_utils
from ml_collections import ConfigDict

from runtime.checkpoints import batch_limit
from runtime.checkpoints import checkpoint
from runtime.checkpoints import checkpoint_meta
from runtime.common import goodput
from runtime.common import layout
from runtime import compile_events
from runtime import config_reads
from runtime import coordination
from runtime import dispatch
from runtime import evaluation
from runtime import fingerprint as fingerprint_lib
from runtime import hooks as hooks_lib
from runtime import integrity
from runtime.checkpoints import local_checkpoint
from runtime import loader
from runtime import loop
from runtime import metrics as metrics_lib
from runtime import options as options_lib
from runtime import plan as plan_lib
from runtime.parallelism import microbatches
from runtime import readers as readers_lib
from runtime.checkpoints import recovery
from runtime import step as step_lib
from runtime import task as task_lib

NonFiniteLossError = loop.NonFiniteLossError
layout_fields = plan_lib.layout_fields
max_steps_in_flight = plan_lib.max_steps_in_flight
Task = task_lib.Task
TrainResult = task_lib.TrainResult
DataSourceError = task_lib.DataSourceError


def _open_checkpoints(options: options_lib.Checkpointing, attempt: str,
                      state: Any):
  """(persistent tier, local tier); None for each that is off. The local
  copies name the attempt that wrote them, and their default place has
  room for copies of `state` (host arrays)."""
  if not options.enabled:
    return None, None
  ckpt = checkpoint.open_for(options)
  size = sum(getattr(x, 'nbytes', 0) for x in jax.tree_util.tree_leaves(state))
  return ckpt, local_checkpoint.open_for(options.local, ckpt.path, attempt,
                                         size)


def _hooks(options: options_lib.TrainOptions, record: layout.Record, task: Task,
           topo, ckpt, local) -> list[hooks_lib.Hook]:
  """The built-in hooks, in the order they run, then the task's."""
  log = hooks_lib.LogMetrics(options.logging.every, task.schedule)
  describe = lambda run, numpy_state, reason: checkpoint_meta.describe_run(
      options.checkpointing, topo, len(task.data), run.step, numpy_state, reason
  )
  replicas = integrity.CheckReplicas(options.integrity_every,
                                     ckpt.all_steps if ckpt else lambda: [])
  # The saves run the replica check of their step first, and the local
  # tier's end waits for the persistent save: no order matters below.
  save = None
  if ckpt is not None:
    save = hooks_lib.SaveCheckpoints(ckpt, describe, checks=[replicas])
  copies = None
  if local is not None:
    copies = hooks_lib.SaveLocalCheckpoints(local,
                                            ckpt,
                                            describe,
                                            checks=[replicas])
  built_in = [log, hooks_lib.PreemptionAgreement(log, save, copies), replicas]
  if copies is not None:
    built_in.append(copies)
  if save is not None:
    built_in.append(save)
  if task.eval_fn is not None:
    built_in.append(
        hooks_lib.PeriodicEvaluation(options.eval_every, task.eval_fn))
  if options.logging.profile_steps:
    built_in.append(
        hooks_lib.Profile(record.tensorboard(), options.logging.profile_start,
                          options.logging.profile_steps))
  return built_in + list(task.hooks)


def train(config: ConfigDict, workdir: str, task: Task) -> TrainResult:
  """Trains `task` to step `config.steps` on every device of the job: the
  plan (runtime/plan.py), the restore of the newest copy of the state in
  the job, the loop with its hooks, the result.

  Args:
    config: a config made from runtime/config_base.py.
    workdir: where metrics.jsonl, tensorboard/, ranks/ and, by default,
      checkpoints/ go.
    task: the model and data.

  Returns:
    A TrainResult, the same on every process but for final_metrics' timing.

  Raises: BatchSizeError, NonFiniteLossError, CheckpointError; Preempted.
  """
  ledger = goodput.current()
  ledger.name_since('workload', 'workload_setup')
  # The one Record of the run: the launcher's `Workdir` carries it, a path
  # given by hand is read for the bucket it may be a copy of.
  record = layout.Record.of(workdir)
  with ledger.naming('train_setup'):
    plan = plan_lib.make(config, record, task)
  ledger.note(topology=plan.fields())
  restored = _restore(plan, task, ledger)
  if restored.step >= plan.options.steps:
    return _nothing_to_train(plan, record, restored)
  run, hooks, calls = _start_run(plan, config, record, task, restored, ledger)
  try:
    _run_steps(plan, calls, run, task, restored.step, hooks)
  finally:
    run.clock.close()
    with ledger.naming('results'):
      run.writer.close()
  config_reads.finish(config)
  with ledger.naming('results'):
    return _result(plan, run, record)


@dataclasses.dataclass
class _Restored:
  """Where the run starts: its step, the state there, the tiers it
  saves to (None: off) and the tier it came from ('fresh': none)."""
  step: int
  state: step_lib.TrainState
  ckpt: Any
  local: Any
  tier: str


def _restore(plan: plan_lib.Plan, task: Task,
             ledger: goodput.Ledger) -> _Restored:
  """The newest copy of the state anywhere in the job, or the plan's
  initial state at step 0; noted in the ledger and said where it was saved
  on another topology."""
  options = plan.options
  started = time.perf_counter()
  with ledger.timing('checkpoint_restore'):
    ckpt, local = _open_checkpoints(options.checkpointing, options.attempt,
                                    plan.state)
    start, state, tier = recovery.restore(options.checkpointing, ckpt, local,
                                          plan.state, len(task.data),
                                          plan.state_layout.shardings)
  _note_restore(ledger, local, tier, state, time.perf_counter() - started)
  if start:
    _say_where_it_resumes(ckpt, start, plan.topology)
  return _Restored(start, state, ckpt, local, tier)


def _start_run(
    plan: plan_lib.Plan, config: ConfigDict, record: layout.Record, task: Task,
    restored: _Restored, ledger: goodput.Ledger
) -> tuple[loop.Run, list[hooks_lib.Hook], plan_lib.Calls]:
  """(the loop's state placed on the devices with its metrics writer open,
  its hooks, the steps per call their cadences allow), the run's first
  lines said, and the end of set-up's checks passed."""
  hooks = _hooks(plan.options, record, task, plan.topology, restored.ckpt,
                 restored.local)
  calls = plan_lib.calls(plan, task, hooks)
  with ledger.naming('metrics_writer'):
    writer = metrics_lib.MetricsWriter(
        record,
        plan.topology.process_index == 0,
        resume_step=restored.step or None,
        tensorboard_events=plan.options.logging.tensorboard,
        fields=plan.fields())
  with ledger.naming('replicate'):
    replicated = plan.state_layout.place(restored.state, plan.parallelism)
  clock = goodput.StepClock(ledger, goodput.steps_done_before(ledger),
                            compile_events.seconds_in_this_thread)
  run = loop.Run(plan, task, replicated, restored.step, writer, clock)
  if plan.topology.process_index == 0:
    _remember_layout_once(run, plan.options.groups.steered(), record,
                          plan.batch_layout)
  writer.log(plan.describe(restored.step, calls))
  if plan.state_layout.where:
    writer.log(plan.state_layout.where)
    if task.eval_fn is not None:
      writer.log(_evaluation_memory(restored.state.params))
  # The end of set-up: another trainer's names that nothing read are refused,
  # and the evaluation's contract is checked by tracing it.
  config_reads.check(config, plan.topology.global_device_count)
  if task.eval_fn is not None:
    with ledger.naming('eval_check'):
      evaluation.check_eval_fn(task.eval_fn, replicated.params,
                               replicated.model_state)
  return run, hooks, calls


def _run_steps(plan: plan_lib.Plan, calls: plan_lib.Calls, run: loop.Run,
               task: Task, start: int, hooks: list[hooks_lib.Hook]) -> None:
  """The steps after `start`, to the last, with the hooks; the batches
  read by the record readers' processes where the data is on the host."""
  options = plan.options
  readers = (None if options.data.on_device else readers_lib.start(
      task.data, options.data.workers, plan.rows_per_process,
      coordination.current()))
  try:
    load = loader.make(options.data, task, plan.topology, plan.parallelism,
                       plan.batch_layout, readers)
    with dispatch.Dispatches(load,
                             start,
                             options.steps,
                             calls.per_dispatch,
                             calls.auto,
                             size=options.data.prefetch) as dispatches:
      loop.run_steps(run, plan.programs, dispatches.next, hooks)
  finally:
    if readers is not None:
      readers.close()


def _evaluation_memory(params: Any) -> str:
  """The line on what evaluation under sharded state costs: eval_fn takes
  the parameters, and a map over the devices (runtime.evaluate's) gathers
  them whole on every device while it runs."""
  whole = sum(
      getattr(x, 'nbytes', 0) for x in jax.tree_util.tree_leaves(params))
  return (f'evaluation: eval_fn gets the parameters whole on every device '
          f'while it runs, {whole / 2**20:.1f} MiB a device on top of the '
          'sharded state (runtime.evaluate maps over the devices with them '
          'replicated); score within the step\'s memory by evaluating less '
          'often (config.eval_every), or in a jit of your own over the '
          'sharded arrays')


def _note_restore(ledger: goodput.Ledger, local, tier: str,
                  state: step_lib.TrainState, seconds: float) -> None:
  """Notes what the restore read and in how long, and tells the local
  tier's cadence what a hard failure costs (runtime/checkpoints/
  local_cadence.py): this restore's seconds and the job's failures so
  far."""
  if tier != 'fresh':
    size = sum(
        getattr(x, 'nbytes', 0) for x in jax.tree_util.tree_leaves(state))
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


def _remember_layout_once(run: loop.Run, steered: bool, record: layout.Record,
                          chosen: microbatches.Layout) -> None:
  """Keeps the group size for later attempts once the first call has run
  (runtime/checkpoints/batch_limit.py): a run refused before step 1 leaves
  nothing behind."""
  done: list[bool] = []

  def first(_):
    if not done:
      done.append(True)
      batch_limit.remember(steered, record, chosen)

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
    logging.info(
        'the checkpoint of step %d was saved by %d process(es) on %d '
        'device(s); this run resumes it on %d process(es), %d '
        'device(s), with the same global batch', start, *then, *now)


def _nothing_to_train(plan: plan_lib.Plan, record: layout.Record,
                      restored: _Restored) -> TrainResult:
  """The TrainResult of a run whose checkpoint is already at its last
  step: it says so, trains and evaluates nothing, and marks the result
  untrained so that the record stays the trained run's."""
  options, start, state = plan.options, restored.step, restored.state
  if plan.topology.process_index == 0:
    logging.warning(
        'nothing to train: the checkpoint in %s is already at step %d of '
        'config.steps=%d. This run trains nothing and leaves summary.json as '
        'the run that trained wrote it. To train again from step 0, give '
        'another --workdir; to train further, raise --config.steps.',
        options.checkpointing.directory or record.workdir, start, options.steps)
  if any(
      isinstance(leaf, jax.Array) and not leaf.is_fully_addressable
      for leaf in jax.tree_util.tree_leaves(state)):
    # A sharded state restored across processes: every process runs this.
    host = multihost_utils.process_allgather(state, tiled=True)
  else:
    host = jax.device_get(state)
  return TrainResult(final_metrics={},
                     eval_metrics={},
                     fingerprint=fingerprint_lib.fingerprint(host.params),
                     params=host.params,
                     model_state=host.model_state,
                     start_step=start,
                     steps=options.steps,
                     topology=plan.fields(),
                     trained=False)


def _log_final_metrics(run: loop.Run,
                       writer: metrics_lib.MetricsWriter) -> None:
  """Says what final_metrics are, since they differ from the last line."""
  if run.last_metrics:
    values = ' '.join(f'{k}={v:g}' for k, v in sorted(run.last_metrics.items()))
    writer.log(f'final_metrics, of step {run.step} alone: {values} (each '
               f'step line above is a mean over up to log_every='
               f'{run.options.logging.every} steps)')


def _result(plan: plan_lib.Plan, run: loop.Run,
            record: layout.Record) -> TrainResult:
  """The TrainResult, with the chip's figures; also says what the final
  metrics are and writes ranks/rank_<i>.json for comparison."""
  _log_final_metrics(run, run.writer)
  topo = plan.topology
  host = run.numpy_state()
  fingerprint = fingerprint_lib.fingerprint(host.params)
  metrics_lib.write_json(
      record.result(topo.process_index), {
          'process_index': topo.process_index,
          'process_count': topo.process_count,
          'local_devices': [str(d) for d in jax.local_devices()],
          'steps': run.steps,
          'start_step': run.start_step,
          'fingerprint': fingerprint,
      })
  figures, memory = plan.figures, plan.programs.memory()
  chip = figures.summary(figures.mean_steps_per_sec())
  if memory:
    chip['step_memory'] = memory
  return TrainResult(final_metrics=run.last_metrics,
                     eval_metrics=run.eval_metrics,
                     fingerprint=fingerprint,
                     params=host.params,
                     model_state=host.model_state,
                     start_step=run.start_step,
                     steps=run.steps,
                     topology=plan.fields(),
                     chip=chip)
