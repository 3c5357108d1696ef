"""What a checkpoint records about its run, and the checks before resuming.

A checkpoint's 'meta' item (both tiers: runtime/checkpoints/checkpoint.py and
runtime/checkpoints/local_checkpoint.py) holds the step, the data-stream
position, the config that decides the trajectory and the shapes of the state;
resuming checks this run against it and names every difference.

Example:
  >>> options = checkpoint_options.Checkpointing.of(config, workdir)
  >>> meta = describe_run(options, topo, 60000, 400, numpy_state, 'periodic')
  >>> check_restorable(meta, options.trajectory, state,
  ...                  '/runs/a/checkpoints/400')
"""

from typing import Any

import jax
import numpy as np

from runtime.common import exit_codes
from runtime.common import mappings
from runtime import config_reads

# The config sections that decide what a run computes. A resumed run must
# agree with its checkpoint on these (but for config.restore_may_change);
# every other field only steers the run (its length, logging, checkpoint
# cadence, topology, paths) and may change, with no list to keep up.
TRAJECTORY_SECTIONS = ('workload', 'seed', 'global_batch_size', 'model',
                       'optimizer', 'data')

# Fields of the trajectory sections that steer how the data reach the
# devices, not which: a resumed run may change them.
HOW_NOT_WHAT = ('data.on_device', 'data.workers')


class CheckpointError(exit_codes.PodrunError):
  """A checkpoint that cannot be used here, or a directory that cannot hold
  the job's checkpoints."""
  exit_code = exit_codes.CHECKPOINT_ERROR


def describe_state(state: Any) -> list[list[Any]]:
  """[[path, shape, dtype], ...] of every array of `state`, in tree order."""
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  return [[
      jax.tree_util.keystr(path),
      list(np.shape(leaf)),
      str(np.result_type(leaf))
  ] for path, leaf in leaves]


def data_position(step: int, global_batch_size: int,
                  num_examples: int) -> dict[str, int]:
  """Where the example stream stands after `step` steps (see data.py)."""
  consumed = step * global_batch_size
  return {
      'examples_consumed': consumed,
      'epoch': consumed // num_examples,
      'examples_into_epoch': consumed % num_examples
  }


def check(meta: dict[str, Any], trajectory: dict[str, Any], state: Any,
          num_examples: int, step: int, where: str) -> None:
  """Refuses a copy of the state, either tier's, that this run cannot resume
  from: every check a restore makes, in one place.

  Args:
    meta: the copy's 'meta' item.
    trajectory: this run's `options.trajectory_config`.
    state: this run's freshly initialised state.
    num_examples: the size of this run's training data.
    step: the copy's step, for the message.
    where: the copy, for the message.

  Raises:
    CheckpointError: as check_restorable and check_same_data say.
  """
  check_restorable(meta, trajectory, state, where)
  check_same_data(meta, num_examples, step, where)


def check_restorable(meta: dict[str, Any], trajectory: dict[str, Any],
                     state: Any, path: str) -> None:
  """Refuses a checkpoint whose config or state shapes differ from this run's.

  Args:
    meta: the checkpoint's 'meta' item.
    trajectory: this run's `options.trajectory_config`.
    state: this run's freshly initialised state (arrays or shape structs).
    path: the checkpoint, for the message.

  Raises:
    CheckpointError: naming every field and array that disagrees, with both
      values.
  """
  problems = []
  for key, saved, now in mappings.changes(meta['config'], trajectory):
    problems.append(f'config.{key}: checkpoint {_show(saved)}, this run '
                    f'{_show(now)}')

  def arrays(described):
    return {p: f'shape {tuple(s)} {d}' for p, s, d in described}

  for key, saved, now in mappings.changes(arrays(meta['state']),
                                          arrays(describe_state(state))):
    problems.append(f'state{key}: checkpoint {saved}, this run {now}')
  if problems:
    raise CheckpointError(
        f'cannot resume from {path}; it was made by a different run:\n  ' +
        '\n  '.join(problems) + '\nPoint --workdir (or config.checkpoint_dir) '
        'at a new directory to start afresh, or undo the change. The sections '
        + ', '.join(TRAJECTORY_SECTIONS) + ' decide the trajectory, and '
        'another trainer\'s names a workload reads (' +
        ', '.join(config_reads.FOREIGN_TRAJECTORY[3:6]) + ', ...); list a '
        'field of them in config.restore_may_change to allow a change '
        'anyway. Every other field may change on resume.')


def _show(value: Any) -> str:
  return value if value is mappings.ABSENT else repr(value)


def check_same_data(meta: dict[str, Any], num_examples: int, step: int,
                    where: str) -> None:
  """Refuses a checkpoint made on a data set of another size.

  The stream position is the step's only on the same data set; the config
  need not name its size (MNIST reads it from files).
  """
  if meta['data']['num_examples'] != num_examples:
    raise CheckpointError(
        f'the checkpoint of step {step} in {where} was made on '
        f'{meta["data"]["num_examples"]} training examples; this run has '
        f'{num_examples}. Resume on the same data, or start afresh in a new '
        '--workdir.')


def describe_run(options, topo, num_examples: int, step: int, state: Any,
                 reason: str) -> dict[str, Any]:
  """The 'meta' item of the checkpoint of `step`: what resuming checks
  (options: the run's checkpoints.options.Checkpointing)."""
  return {
      'step': step,
      'reason': reason,
      'data': {
          **data_position(step, options.global_batch_size, num_examples), 'num_examples':
              num_examples,
          'seed':
              options.seed
      },
      'config': options.trajectory,
      'state': describe_state(state),
      'saved_by': {
          'process_count': topo.process_count,
          'device_count': topo.global_device_count,
          'platform': topo.platform,
          'jax_version': jax.__version__
      },
  }
