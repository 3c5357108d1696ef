"""How each step's global batch sits on this job's devices, chosen before
step 1: `microbatches.plan` under the config's limits, in the group size the
job's first attempt kept (runtime/checkpoints/batch_limit.py), never padded
where the model's loss mixes rows between devices, and checked on every
process count an elastic job may run on.

Padding groups count nothing in the step's mean (runtime/step.py), but a
loss with its own collective over the batch axis (Flax's
`nn.BatchNorm(axis_name=...)`) would sum them into every device's
statistics. So a padded layout is kept only for a loss whose jaxpr holds no
such collective; otherwise the layout without padding with the fewest
passes is chosen, or, where the devices cannot take the batch without
padding, the run is refused before step 1 with the batches and device
counts that can.

Example:
  >>> mixing = loss_mixing(task, state, 'batch', 8)
  >>> choose(options.data.global_batch_size, options.groups, topo, record,
  ...        mixing=mixing).describe()
  '1 microbatch(es) of 12 example(s) per device'
"""

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

from absl import logging
import jax
import numpy as np

from runtime.checkpoints import batch_limit
from runtime.common import layout
from runtime import data as data_lib
from runtime import options as options_lib
from runtime.parallelism import microbatches
from runtime import step as step_lib

# rows -> the collectives over the batch axis that a group of that many rows
# takes in the loss ((): none).
Mixing = Callable[[int], tuple[str, ...]]


class PaddingError(microbatches.LayoutError):
  """The batch must be padded on these devices, and the loss would see the
  padding through its collective (exit 2)."""


class Limits(NamedTuple):
  """What the config (or the job's first attempt) fixes of the groups, as
  `microbatches.plan` takes them; None for free."""
  device_batch_limit: Optional[int]
  microbatches: Optional[int]
  microbatch_size: Optional[int]


def loss_mixing(loss_fn: step_lib.LossFn, rng: Optional[str],
                has_model_state: bool, state: step_lib.TrainState, data: Any,
                axis: Any, num_devices: int) -> Mixing:
  """The `Mixing` of a task's loss: its jaxpr on a group of `rows` examples
  shaped as `data`'s, traced once per group size and only when asked."""

  def struct(x):
    return jax.ShapeDtypeStruct(np.shape(x), np.result_type(x))

  state = jax.tree_util.tree_map(struct, state)
  found: dict[int, tuple[str, ...]] = {}

  def mixing(rows: int) -> tuple[str, ...]:
    if rows not in found:
      example = data_lib.first_example(data)
      group = jax.tree_util.tree_map(
          lambda x: jax.ShapeDtypeStruct(
              (rows,) + np.shape(x)[1:], np.result_type(x)), example)
      found[rows] = step_lib.loss_collectives(loss_fn, state, group, rng,
                                              has_model_state, axis,
                                              num_devices)
    return found[rows]

  return mixing


def _near_divisors(n: int, around: int) -> tuple[int, ...]:
  """The divisors of n nearest `around` from below and above."""
  divisors = [d for d in range(1, n + 1) if n % d == 0]
  below = [d for d in divisors if d < around]
  above = [d for d in divisors if d > around]
  return tuple(([below[-1]] if below else []) + ([above[0]] if above else []))


def _refusal(padded: microbatches.Layout, names: tuple[str, ...], axis: Any,
             limits: Limits, user_size: Optional[int]) -> str:
  g, d = padded.global_batch_size, padded.num_devices
  fixes = []
  if user_size:
    fixes.append(f'set config.microbatch_size to 0, or to a size whose '
                 f'groups fill the {d} devices')
  batches = microbatches.batches_without_padding(g, d)
  if batches != (g,):
    fixes.append('set config.global_batch_size to ' +
                 ' or '.join(map(str, batches)) + f' (multiples of {d})')
    counts = _near_divisors(g, d)
    if counts:
      fixes.append('run on ' + ' or '.join(map(str, counts)) +
                   f' devices (dividing {g})')
  elif limits.device_batch_limit or limits.microbatches:
    fixes.append('loosen config.device_batch_limit or config.microbatches, '
                 f'which leave no layout of {g} on {d} devices without '
                 'padding')
  return (f'global batch size {g} on {d} devices would be laid out as '
          f'{padded.describe()}, but loss_fn takes a collective over the '
          f'axis {axis!r} ({", ".join(names)}: a cross-device BatchNorm, or '
          'a lax.pmean in the model), which every padding row would enter, '
          'changing the loss and the model state. To train without padding, ' +
          '; or '.join(fixes) + '.')


def _several_passes(chosen: microbatches.Layout, names: tuple[str, ...],
                    axis: Any) -> str:
  return (f'global batch size {chosen.global_batch_size} on '
          f'{chosen.num_devices} devices is laid out as {chosen.microbatches} '
          f'pass(es) a device ({chosen.describe()}), but loss_fn takes a '
          f'collective over the axis {axis!r} ({", ".join(names)}), which sees '
          'one pass\'s rows at a time: a loss divided by a lax.psum of its '
          'token counts, say, would then be another figure. Return the loss as '
          'runtime.Weighted(summed loss, count) instead, with no collective '
          '(podrun sums both over every pass and device of the step before '
          'dividing: exact on any layout); or run one pass a device '
          '(config.microbatches=1, a looser config.device_batch_limit, and in '
          'an elastic job a config.microbatch_size that fills the fewest '
          'devices).')


def _layout_for(global_batch_size: int,
                num_devices: int,
                limits: Limits,
                user_size: Optional[int],
                mixing: Optional[Mixing],
                axis: Any,
                has_model_state: bool = False) -> microbatches.Layout:
  """`microbatches.plan`'s layout, or where it pads and the loss mixes
  devices, the unpadded one with the fewest passes.

  Raises:
    PaddingError: where there is no unpadded layout (or the user fixed the
      group size that pads), naming what would train without padding; and
      where a loss without model state mixes devices and a device runs more
      than one pass (`_several_passes`).
  """
  chosen = microbatches.plan(global_batch_size, num_devices, *limits)
  if mixing is None:
    return chosen
  if chosen.microbatches > 1 and not has_model_state:
    names = mixing(chosen.microbatch_size)
    if names:
      raise PaddingError(_several_passes(chosen, names, axis))
  if not chosen.padded_groups:
    return chosen
  names = mixing(chosen.microbatch_size)
  if not names:
    return chosen
  fixed = None if user_size else microbatches.unpadded(
      global_batch_size, num_devices, limits.device_batch_limit,
      limits.microbatches)
  if fixed is None:
    raise PaddingError(_refusal(chosen, names, axis, limits, user_size))
  return dataclasses.replace(
      fixed,
      note=(
          f'unpadded, since loss_fn takes a collective over {axis!r} '
          f'({", ".join(names)}); groups of {chosen.microbatch_size} would pad '
          f'{chosen.padded_groups} of '
          f'{chosen.num_devices * chosen.microbatches}'))


def choose(global_batch_size: int,
           groups: options_lib.Groups,
           topo,
           record: Optional[layout.Record] = None,
           has_model_state: bool = False,
           elastic: Optional[tuple[int, int]] = None,
           mixing: Optional[Mixing] = None,
           axis: Any = 'devices') -> microbatches.Layout:
  """How each step's global batch sits on this job's devices.

  Args:
    global_batch_size: G, every device of the job together.
    groups: the config's limits on a device's passes.
    topo: this job's topology (process_count, local_device_count,
      process_index).
    record: where the job's first group size is kept; None: not read.
    has_model_state: the task has model state (a warning for elastic
      jobs): its collectives are BatchNorm's, whose statistics are a
      group's by design, so several passes are not refused.
    elastic: (fewest, most) processes; None for a job of a fixed size.
    mixing: the loss's collectives over the batch axis (`loss_mixing`);
      None: padding is taken as harmless.
    axis: the batch axis's name, for messages.

  Raises:
    LayoutError: where no layout fits, naming why (PaddingError: where the
      only ones pad and the loss mixes devices).
  """
  num_devices = topo.process_count * topo.local_device_count
  user_size = groups.microbatch_size
  size, note = user_size, ''
  if record is not None and size is None:
    size, note = batch_limit.first_group_size(global_batch_size,
                                              groups.steered(), record)
  limits = Limits(groups.device_batch_limit, groups.microbatches, size)
  sizes = check_elastic_layouts(global_batch_size, topo.local_device_count,
                                limits, elastic, mixing, axis, user_size,
                                has_model_state)
  if has_model_state and len(sizes) > 1 and topo.process_index == 0:
    logging.warning(
        'the model state (BatchNorm\'s statistics) is computed over groups '
        'of %s examples depending on how many processes this elastic job '
        'runs on: set config.microbatch_size to one of them to keep the '
        'groups, and the step, the same', sorted(sizes))
  chosen = _layout_for(global_batch_size, num_devices, limits, user_size,
                       mixing, axis, has_model_state)
  if note and not chosen.note:
    chosen = dataclasses.replace(chosen, note=note)
  return chosen


def check_elastic_layouts(global_batch_size: int,
                          local_device_count: int,
                          limits: tuple,
                          elastic: Optional[tuple[int, int]],
                          mixing: Optional[Mixing] = None,
                          axis: Any = 'devices',
                          user_size: Optional[int] = None,
                          has_model_state: bool = False) -> set[int]:
  """Refuses, before step 1, a config that one of the process counts an
  elastic job may run on cannot lay out (without padding, where `mixing`
  finds the loss mixing devices).

  Args:
    global_batch_size: G.
    local_device_count: each process's devices (hosts are alike).
    limits: (device_batch_limit, microbatches, microbatch_size) as
      `microbatches.plan` takes them.
    elastic: (fewest, most) processes; None for a job of a fixed size.
    mixing, axis, user_size, has_model_state: as `choose`.

  Returns:
    The group sizes those layouts have (empty when the job is not elastic).

  Raises:
    LayoutError: naming the process count, the devices and why.
  """
  if not elastic:
    return set()
  fewest, most = elastic
  sizes = set()
  for processes in range(fewest, most + 1):
    try:
      sizes.add(
          _layout_for(global_batch_size, processes * local_device_count,
                      Limits(*limits), user_size, mixing, axis,
                      has_model_state).microbatch_size)
    except microbatches.LayoutError as e:
      raise type(e)(
          f'this elastic job may run on {fewest} to {most} processes, and '
          f'on {processes} x {local_device_count} devices: {e}') from None
  return sizes
