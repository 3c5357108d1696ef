"""Checkpoints of a training run, through orbax-checkpoint's CheckpointManager.

A checkpoint of step s holds what step s + 1 depends on: the parameters, the
optimiser state and the RNG key (item 'state', host arrays that process 0
writes), and a JSON item 'meta' with the step, the data-stream position, the
config that decides the trajectory and the shapes of the state. Resuming from
it gives, on CPU, bit-identical results to a run that never stopped.

Orbax writes each step into a temporary directory and renames it when every
process is done, so a save cut short by SIGKILL is never taken for a
checkpoint: `latest_step` skips it and the next start removes it.

The saved arrays carry no device axis (the step keeps its state replicated
without one), so a checkpoint written by 1 process x 8 devices restores on
2 processes x 4 devices, or any other data-parallel topology.
"""

import logging as stdlib_logging
import os
import uuid
from typing import Any, Optional

from absl import logging
from etils import epath
import jax
from ml_collections import ConfigDict
import numpy as np
import orbax.checkpoint as ocp

from launcher import exit_codes
from runtime import coordination

# The config sections that decide what a run computes. A resumed run must
# agree with its checkpoint on these (but for config.restore_may_change);
# every other field only steers the run (its length, logging, checkpoint
# cadence, topology, paths) and may change, with no list to keep up.
TRAJECTORY_SECTIONS = ('workload', 'seed', 'global_batch_size', 'model',
                       'optimizer', 'data')

_SHARED_CHECK_DIR = '.shared_check'


class CheckpointError(exit_codes.PodrunError):
  """A checkpoint that cannot be used here, or a directory that cannot hold
  the job's checkpoints."""
  exit_code = exit_codes.CHECKPOINT_ERROR


def directory(config: ConfigDict, workdir: str) -> str:
  """Where the run's checkpoints go: config.checkpoint_dir or WORKDIR/checkpoints.

  Example:
    >>> directory(config, '/tmp/w')  # config.checkpoint_dir == ''
    '/tmp/w/checkpoints'
  """
  configured = config.checkpoint_dir
  return configured if configured else os.path.join(workdir, 'checkpoints')


def _flatten(value: Any, prefix: str = '') -> dict[str, Any]:
  if hasattr(value, 'items'):
    out = {}
    for k, v in value.items():
      out.update(_flatten(v, f'{prefix}{k}.'))
    return out
  if isinstance(value, tuple):
    value = list(value)
  return {prefix[:-1]: value}


def trajectory_config(config: ConfigDict) -> dict[str, Any]:
  """The config fields a checkpoint must agree on, flattened to 'a.b' keys.

  Every field of TRAJECTORY_SECTIONS but those config.restore_may_change
  names (a field, or a whole section).
  """
  allowed = set(config.restore_may_change)
  sections = {k: v for k, v in config.to_dict().items()
              if k in TRAJECTORY_SECTIONS}
  flat = _flatten(sections)
  return {k: v for k, v in sorted(flat.items())
          if not any(k == a or k.startswith(a + '.') for a in allowed)}


def describe_state(state: Any) -> list[list[Any]]:
  """[[path, shape, dtype], ...] of every array of `state`, in tree order."""
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  return [[jax.tree_util.keystr(path), list(np.shape(leaf)),
           str(np.result_type(leaf))] for path, leaf in leaves]


def data_position(step: int, global_batch_size: int,
                  num_examples: int) -> dict[str, int]:
  """Where the example stream stands after `step` steps (see data.py)."""
  consumed = step * global_batch_size
  return {'examples_consumed': consumed,
          'epoch': consumed // num_examples,
          'examples_into_epoch': consumed % num_examples}


def check_restorable(meta: dict[str, Any], config, state: Any, path: str
                     ) -> None:
  """Refuses a checkpoint whose config or state shapes differ from this run's.

  Args:
    meta: the checkpoint's 'meta' item.
    config: this run's config.
    state: this run's freshly initialised state (arrays or shape structs).
    path: the checkpoint, for the message.

  Raises:
    CheckpointError: naming every field and array that disagrees, with both
      values.
  """
  problems = []
  saved, now = meta['config'], trajectory_config(config)
  for key in sorted(set(saved) | set(now)):
    if saved.get(key, '<absent>') != now.get(key, '<absent>'):
      problems.append(f'config.{key}: checkpoint {saved.get(key, "<absent>")!r}'
                      f', this run {now.get(key, "<absent>")!r}')
  saved_arrays = {p: (s, d) for p, s, d in meta['state']}
  now_arrays = {p: (s, d) for p, s, d in describe_state(state)}
  for key in sorted(set(saved_arrays) | set(now_arrays)):
    a, b = saved_arrays.get(key), now_arrays.get(key)
    if a != b:
      show = lambda v: 'absent' if v is None else f'shape {tuple(v[0])} {v[1]}'
      problems.append(f'state{key}: checkpoint {show(a)}, this run {show(b)}')
  if problems:
    raise CheckpointError(
        f'cannot resume from {path}; it was made by a different run:\n  ' +
        '\n  '.join(problems) + '\nPoint --workdir (or config.checkpoint_dir) '
        'at a new directory to start afresh, or undo the change. The sections '
        + ', '.join(TRAJECTORY_SECTIONS) + ' decide the trajectory; list a '
        'field of them in config.restore_may_change to allow a change '
        'anyway. Every other field may change on resume.')


def check_shared(path: str) -> None:
  """Checks that every process of the job sees the same checkpoint directory.

  Process 0 writes a marker with a fresh token; every process then looks for
  it. A directory on each host's own disk (a local path on a multi-host
  pod) fails here, on every process at once, instead of later as a hang or
  as per-host fragments of checkpoints. Single-process jobs pass at once.
  Every wait is bounded (--barrier_timeout) and names who did not come.

  Raises:
    CheckpointError: naming the processes that cannot see the marker.
    coordination.BarrierTimeout: naming the processes that did not answer.
  """
  job = coordination.current()
  if job is None or job.process_count == 1:
    return
  name = f'podrun/shared_check/{_next_check_number()}'
  if job.process_id == 0:
    token = uuid.uuid4().hex
    # epath, as orbax uses, so that gs:// and other remote paths work too.
    marker = epath.Path(path) / _SHARED_CHECK_DIR / token
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(token)
    job.set(f'{name}/token', token)
  else:
    token = job.wait(f'{name}/token', coordination.default_timeout())
    if token is None:
      raise coordination.BarrierTimeout(f'{name}/token', [0],
                                        coordination.default_timeout(),
                                        job.process_count)
    marker = epath.Path(path) / _SHARED_CHECK_DIR / token
  try:
    sees = marker.read_text() == token
  except (OSError, FileNotFoundError):
    sees = False
  job.set(f'{name}/sees/{job.process_id}', '1' if sees else '0')
  job.barrier(f'{name}/read')
  if job.process_id == 0:
    marker.unlink()
  blind = sorted(int(k.rsplit('/', 1)[1])
                 for k, v in job.directory(f'{name}/sees').items() if v != '1')
  if blind:
    raise CheckpointError(
        f'the checkpoint directory {path} is not shared: process(es) '
        f'{blind} of {job.process_count} cannot see the file {marker} that '
        'process 0 wrote there. Every process of a multi-process job must '
        'write to the same storage: use a shared file system or a bucket '
        '(for example --config.checkpoint_dir=gs://BUCKET/RUN/checkpoints on '
        'a TPU pod).')


_check_count = 0


def _next_check_number() -> int:
  global _check_count
  _check_count += 1
  return _check_count


class _Manager(ocp.CheckpointManager):
  """A CheckpointManager that leaves preemption decisions to the training loop.

  Orbax would otherwise call JAX's preemption sync point with the global step
  number from inside `save`, while the loop calls it with its own counter;
  the sync protocol needs one consistent counter per process.
  """

  def reached_preemption(self, step: int) -> bool:
    del step
    return False


class Checkpoints:
  """The run's checkpoint directory: save every N steps, keep K, restore.

  Example:
    >>> ckpt = Checkpoints('/tmp/w/checkpoints', every=100, keep=3)
    >>> restored = ckpt.restore_latest(config, state)  # None on a fresh start
    >>> ckpt.save(100, state, meta)                     # returns at once
    >>> ckpt.close()                                    # waits for the disk
  """

  def __init__(self, path: str, every: int, keep: int,
               async_save: bool = True):
    if keep < 1:
      raise ValueError(f'config.keep_checkpoints={keep}; keep at least 1')
    self.path = path
    self.every = every
    self._manager = _Manager(
        path,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save),
        item_names=('state', 'meta'))

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def due(self, step: int) -> bool:
    """Whether `step` is one of the periodic checkpoint steps."""
    return self.every > 0 and step % self.every == 0

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Starts saving `state` (host arrays) as step `step`; returns at once.

    Does nothing when `step` is already saved.
    """
    if step in self._manager.all_steps():
      return
    self._manager.save(
        step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                      meta=ocp.args.JsonSave(meta)),
        force=True)

  def restore_latest(self, config: ConfigDict, like: Any
                     ) -> Optional[tuple[int, Any, dict[str, Any]]]:
    """Restores the newest complete checkpoint, if there is one.

    Args:
      config: this run's config, checked against the checkpoint's.
      like: this run's initial state; gives the tree structure, shapes and
        dtypes to restore into.

    Returns:
      (step, state as host arrays, meta), or None when there is no checkpoint.

    Raises:
      CheckpointError: when the checkpoint does not fit this run.
    """
    step = self._manager.latest_step()
    if step is None:
      return None
    step_path = os.path.join(self.path, str(step))
    meta = self._manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    check_restorable(meta, config, like, step_path)
    target = jax.tree.map(np.asarray, like)
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
    logging.info('restored %s (step %d)', step_path, step)
    return step, restored.state, meta

  def saving(self) -> bool:
    """Whether a started save is still being written."""
    return self._manager.is_saving_in_progress()

  def wait(self) -> None:
    """Blocks until every started save is complete on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def open_for(config: ConfigDict, workdir: str) -> Checkpoints:
  """The run's Checkpoints, after checking every process shares the directory.

  Args:
    config: reads checkpoint_dir, checkpoint_every, keep_checkpoints and
      async_checkpointing.
    workdir: the default parent of the directory.
  """
  path = directory(config, workdir)
  check_shared(path)
  return Checkpoints(path, every=config.checkpoint_every,
                     keep=config.keep_checkpoints,
                     async_save=config.async_checkpointing)


def restore_or_start(ckpt: Checkpoints, config, state: Any, num_examples: int
                     ) -> tuple[int, Any]:
  """(step, state) to start from: the latest checkpoint's, or (0, `state`).

  Args:
    ckpt: the run's checkpoint directory.
    config: reads restore; its trajectory sections are checked against the
      checkpoint's.
    state: the freshly initialised TrainState (host arrays).
    num_examples: the size of the training data.

  Raises:
    CheckpointError: when config.restore is False but checkpoints exist, or
      when the checkpoint was made by a different run or on other data.
  """
  if not config.restore:
    if ckpt.all_steps():
      raise CheckpointError(
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
    raise CheckpointError(
        f'the checkpoint of step {step} in {ckpt.path} was made on '
        f'{meta["data"]["num_examples"]} training examples; this run has '
        f'{num_examples}. Resume on the same data, or start afresh in a new '
        '--workdir.')
  return step, type(state)(*saved_state)


def describe_run(config: ConfigDict, topo, num_examples: int, step: int,
                 state: Any, reason: str) -> dict[str, Any]:
  """The 'meta' item of the checkpoint of `step`: what resuming checks."""
  return {
      'step': step,
      'reason': reason,
      'data': {**data_position(step, config.global_batch_size, num_examples),
               'num_examples': num_examples,
               'seed': config.seed},
      'config': trajectory_config(config),
      'state': describe_state(state),
      'saved_by': {'process_count': topo.process_count,
                   'device_count': topo.global_device_count,
                   'platform': topo.platform,
                   'jax_version': jax.__version__},
  }


class _QuietOrbax(stdlib_logging.Filter):
  """Drops orbax's INFO lines (dozens per save); keeps its warnings.

  Run with --verbosity=1 to see them.
  """

  def filter(self, record: stdlib_logging.LogRecord) -> bool:
    return (record.levelno >= stdlib_logging.WARNING or
            f'{os.sep}orbax{os.sep}' not in record.pathname or
            logging.get_verbosity() > logging.INFO)


stdlib_logging.getLogger('absl').addFilter(_QuietOrbax())
