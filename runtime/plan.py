"""What `train` decides before step 1: the plan of a run.

From the config, the task and the devices: where the data set lives, the
parallelism, where the state lives (replicated, or sharded with its
shardings), the batch layout, the steps per call (or what decides them),
the compiled programs and the figures the step lines give. `make` reads
the config once, through `TrainOptions.of`, and every decision after it
reads the plan.

Example:
  >>> plan = make(config, layout.Record.of(workdir), task)
  >>> plan.batch_layout.describe(), calls(plan, task, hooks).per_dispatch
  ('1 pass of 8 a device', None)
"""

import dataclasses
from typing import Any, Mapping, Optional, Sequence

from absl import logging
import jax
from ml_collections import ConfigDict
import numpy as np

from runtime import batch_layout as batch_layout_lib
from runtime import coordination
from runtime import data as data_lib
from runtime import device_data
from runtime import dispatch
from runtime import flops as flops_lib
from runtime import hooks as hooks_lib
from runtime.checkpoints import local_cadence
from runtime.common import layout
from runtime import options as options_lib
from runtime import parallelism as parallelism_lib
from runtime.parallelism import microbatches
from runtime.parallelism import state_layout
from runtime import programs as programs_lib
from runtime import randomness
from runtime import step as step_lib
from runtime import task as task_lib
from runtime import topology as topology_lib


@dataclasses.dataclass
class Plan:
  """A run's decisions before step 1.

  Attributes:
    options: the config's typed view, with config.data.on_device decided.
    topology: this process's view of the job's devices.
    parallelism: pmap or jit(shard_map) (runtime/parallelism).
    state: the initial state on the host (restored over, where a copy is).
    state_layout: where the state lives, replicated or sharded.
    batch_layout: how a global batch is cut over processes, devices and
      passes.
    rows_per_process: the rows this process places a step.
    in_flight: calls that may be unfinished at once.
    programs: the compiled step for each steps per call.
    figures: the step lines' FLOPs, MFU and tokens.
    data_why: why the data set lives where it does, where the run chose.
    record: the run's record (its workdir's files).
    config: the config itself, for the deprecated `Run.config` alone (it
      goes in 0.3.0; everything else reads `options`).
  """
  options: options_lib.TrainOptions
  topology: topology_lib.Topology
  parallelism: Any
  state: step_lib.TrainState
  state_layout: state_layout.StateLayout
  batch_layout: microbatches.Layout
  rows_per_process: int
  in_flight: int
  programs: programs_lib.Programs
  figures: flops_lib.Figures
  record: layout.Record
  data_why: str = ''
  config: Optional[ConfigDict] = None

  def fields(self) -> dict[str, int]:
    """What every metrics row says of the topology that computed it."""
    return layout_fields(self.topology, self.batch_layout)

  def describe(self, start: int, calls: 'Calls') -> str:
    """The run's first line: what it trains, on what, from where."""
    options, topo = self.options, self.topology
    resumed = f', resuming at step {start}' if start else ''
    per_call = ('steps_per_dispatch=auto' if calls.per_dispatch is None else
                f'{calls.per_dispatch} step(s) per call')
    where_data = ('the data set on the devices' if options.data.on_device else
                  'batches from the host') + (f' ({self.data_why})'
                                              if self.data_why else '')
    return (f'training {options.steps} steps, global batch '
            f'{options.data.global_batch_size} '
            f'({self.batch_layout.describe()}), {self.parallelism}, '
            f'{per_call}, {self.in_flight} call(s) in flight, {where_data}, '
            f'on {topo.describe()}{resumed}')


def make(config: ConfigDict, record: layout.Record,
         task: task_lib.Task) -> Plan:
  """The plan of a run of `task` under `config` on this job's devices.

  Raises:
    BatchSizeError, PaddingError: for a global batch no layout takes.
  """
  options = options_lib.TrainOptions.of(config, record)
  topo = topology_lib.current()
  options, data_why = _data_on_device(options, task, topo.platform)
  par = parallelism_lib.from_placement(options.placement)
  state = step_lib.init_state(task.params, task.step_optimizer(),
                              options.data.seed, task.model_state)
  where = _state_layout(options, topo.num_slices, state, task.shard_dims)
  batch_layout = _choose_layout(topo, record, task, state, options,
                                where.batch_axis(par))
  rows, _ = microbatches.process_positions(batch_layout, topo.process_index,
                                           topo.local_device_count)
  programs = programs_lib.Programs(task, par, batch_layout, where)
  figures = flops_lib.Figures(topo.device_kind, batch_layout.num_devices,
                              programs.flops_per_device,
                              options.data.global_batch_size,
                              task.tokens_per_example, task.flops_per_example,
                              options.peak_tflops)
  return Plan(options, topo, par, state, where, batch_layout,
              rows.stop - rows.start,
              max_steps_in_flight(options.max_steps_in_flight, topo.platform),
              programs, figures, record, data_why, config)


def layout_fields(topo, batch_layout: microbatches.Layout) -> dict[str, int]:
  """What every metrics row says of the topology that computed it."""
  return {
      'num_processes': topo.process_count,
      'num_devices': batch_layout.num_devices,
      'microbatches': batch_layout.microbatches
  }


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


def step_bytes(task: task_lib.Task, rows: int) -> int:
  """The bytes of `rows` examples: one step's batch on one host."""
  example = data_lib.first_example(task.data)
  return rows * sum(
      np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(example))


@dataclasses.dataclass(frozen=True)
class Calls:
  """Steps per call: k, or None for 'auto', and what decides 'auto'
  (runtime/dispatch.py)."""
  per_dispatch: Optional[int]
  auto: dispatch.Auto


def calls(plan: Plan, task: task_lib.Task,
          hooks: Sequence[hooks_lib.Hook]) -> Calls:
  """The run's steps per call, given the hooks whose cadences a call must
  end on (`Hook.cadences`): config.steps_per_dispatch, checked against
  them; or 'auto', measured first on an accelerator, one step a call on a
  CPU or where a task's hook is called after every call.

  Raises:
    DispatchError: for a k that a cadence is not a multiple of.
  """
  options, platform = plan.options, plan.topology.platform
  every = hooks_lib.cadences(hooks)
  auto = dispatch.Auto(
      every, platform, lambda last: local_cadence.recent_step_s(last),
      coordination.current(), lambda: 0
      if options.data.on_device else step_bytes(task, plan.rows_per_process))
  k = options.steps_per_dispatch
  if k is not None:
    dispatch.check_cadences(k, every)
    return Calls(k, auto)
  others = [
      type(h).__name__
      for h in task.hooks
      if not isinstance(h, hooks_lib.Periodic)
  ]
  if platform == 'cpu' or others:
    if others and jax.process_index() == 0:
      logging.info(
          'steps_per_dispatch=auto: one step per call, since the '
          'task\'s hooks %s are called after every step', others)
    return Calls(1, auto)
  return Calls(None, auto)


_REPLICA_WORDS = {
    'process': 'one per process',
    'slice': 'one per slice',
    'all': 'every device'
}


def _state_layout(
    options: options_lib.TrainOptions, num_slices: int,
    state: step_lib.TrainState,
    task_dims: Optional[Mapping[str,
                                Optional[int]]]) -> state_layout.StateLayout:
  """Where the state lives, with the console's line on it, in a job of a
  fixed size or an elastic one (`options.elastic`), on `num_slices`
  slices."""
  placement = options.placement
  replica = state_layout.replica_of(placement, options.elastic,
                                    options.elastic_slices)
  if replica is None:
    return state_layout.REPLICATED
  grid = state_layout.mesh(replica, num_slices)
  shards = grid.shape[state_layout.SHARD_AXIS]
  # The config's patterns first: the first that names a leaf wins.
  from_config = state_layout.parse_dims(placement.shard_dims)
  overrides = {
      **from_config,
      **{
          k: v for k, v in (task_dims or {}).items() if k not in from_config
      }
  }
  specs = state_layout.specs(state, shards, overrides)
  used = state_layout.footprint(state, specs, shards)
  chosen = ('' if not placement.chosen else
            '; parallelism shard_map, chosen for it (pmap holds every '
            'argument whole)')
  return state_layout.StateLayout(
      step_lib.state_shardings(grid, specs),
      (f'state sharded: {grid.shape[state_layout.REPLICA_AXIS]} replica(s) '
       f'({_REPLICA_WORDS[replica]}) of {shards} device(s){chosen}; '
       f'{used.describe()}'))


def _data_on_device(options: options_lib.TrainOptions, task: task_lib.Task,
                    platform: str) -> tuple[options_lib.TrainOptions, str]:
  """The options with config.data.on_device decided where the config left
  it unset (runtime/device_data.py `choose`), and why ('' where set)."""
  if options.data.on_device is not None:
    return options, ''
  chosen, why = device_data.choose(task.data, platform,
                                   jax.local_devices()[0].memory_stats())
  return dataclasses.replace(options,
                             data=dataclasses.replace(options.data,
                                                      on_device=chosen)), why


def _choose_layout(topo, record: layout.Record, task: task_lib.Task,
                   state: step_lib.TrainState,
                   options: options_lib.TrainOptions,
                   axis: Any) -> microbatches.Layout:
  """runtime/batch_layout.py's choice for this job, with the task's loss
  read for collectives over `axis` where a layout would pad."""
  mixing = batch_layout_lib.loss_mixing(
      task.loss_fn, randomness.contract(task.rng, task.loss_uses_rng),
      task.model_state is not None, state, task.data, axis,
      topo.process_count * topo.local_device_count)
  return batch_layout_lib.choose(options.data.global_batch_size, options.groups,
                                 topo, record, task.model_state is not None,
                                 options.elastic, mixing, axis)
