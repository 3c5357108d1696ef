"""The compiled train step for each number of steps per call, built on
first use.

Example:
  >>> programs = Programs(task, par, layout)
  >>> state, metrics = programs(4)(state, batch)   # a call of 4 steps
"""

from typing import Callable, Optional

from absl import logging
import jax

from runtime import agreement
from runtime import coordination
from runtime import flops as flops_lib
from runtime.parallelism import microbatches
from runtime.parallelism import state_layout
from runtime import randomness
from runtime import step as step_lib
from runtime import structure
from runtime import task as task_lib


class Programs:
  """The compiled step for each number of steps per call, built on first
  use: each agreed on by every process before its first run and watched for
  late recompilations. Only the one-step program's FLOPs are measured (XLA's
  cost analysis counts a scan's body once)."""

  def __init__(self,
               task: task_lib.Task,
               par,
               batch_layout: microbatches.Layout,
               where: state_layout.StateLayout = state_layout.REPLICATED):
    self._task, self._par, self._batch_layout = task, par, batch_layout
    self._where = where
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
    measured = self._measured
    if measured is None or measured.memory is None:
      return {}
    return measured.memory.as_dict()

  def __call__(self, steps: int) -> Callable:
    if steps not in self._built:
      self._built[steps] = self._build(steps)
    return self._built[steps]

  def _build(self, steps: int) -> Callable:
    task, has_model_state = self._task, self._task.model_state is not None
    scaled = task.loss_scale is not None
    if self._where.shardings is None:  # Replicated.
      step = step_lib.make_train_step(task.loss_fn,
                                      task.step_optimizer(),
                                      self._par,
                                      rng=self._contract,
                                      has_model_state=has_model_state,
                                      layout=self._batch_layout,
                                      steps=steps,
                                      loss_scale=scaled)
    else:
      step = step_lib.make_sharded_train_step(task.loss_fn,
                                              task.step_optimizer(),
                                              self._where.shardings,
                                              rng=self._contract,
                                              has_model_state=has_model_state,
                                              layout=self._batch_layout,
                                              steps=steps,
                                              loss_scale=scaled,
                                              axis=self._par.axis)
    if steps == 1:
      step = self._measured = flops_lib.Measured(step)
    stage = 'program' if steps == 1 else f'program_{steps}_steps'
    name = 'the train step' if steps == 1 else f'the {steps}-step call'
    return structure.RecompileWatch(
        agreement.check_program_on_first_call(step, coordination.current(),
                                              stage), name)
