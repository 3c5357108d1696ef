"""Checkpoints of a training run, through orbax-checkpoint's CheckpointManager.

A checkpoint of step s holds what step s + 1 depends on: the parameters, the
optimiser state and the RNG key (item 'state': host arrays that process 0
writes, or, for a sharded state, global arrays of which each process writes
the shards it holds), and a JSON item 'meta' with the step, the data-stream position, the
config that decides the trajectory and the shapes of the state. Resuming from
it gives, on CPU, bit-identical results to a run that never stopped. What the
meta holds and how a resume is checked: runtime/checkpoints/checkpoint_meta.py.

Orbax writes each step into a temporary directory and renames it when every
process is done, so a save cut short by SIGKILL is never taken for a
checkpoint: `latest_step` skips it and the next start removes it.

The saved arrays carry no device axis and are whole arrays however they
were split, so a checkpoint written by 1 process x 8 devices restores on
2 processes x 4 devices, or any other data-parallel topology, replicated or
sharded.
"""

import logging as stdlib_logging
import math
import os
import threading
import time
import uuid
from typing import Any, Optional

from absl import logging
from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp

from runtime.checkpoints import checkpoint_meta
from runtime.checkpoints import local_cadence
from runtime.checkpoints import options as checkpoint_options
from runtime import coordination
from runtime.common import gcs_auth

_SHARED_CHECK_DIR = '.shared_check'
# A save that waits less for the one before it is not worth a word.
_QUEUE_SAID_FROM_S = 0.5
# Defined with the checks that raise it most; every tier raises it.
CheckpointError = checkpoint_meta.CheckpointError


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
  client = coordination.current()
  if client is None or client.process_count == 1:
    return
  name = f'podrun/shared_check/{_next_check_number()}'
  # epath, as orbax uses, so that gs:// and other remote paths work too.
  markers = epath.Path(path) / _SHARED_CHECK_DIR
  token = client.from_0(f'{name}/token', lambda: _write_marker(markers))
  marker = markers / token
  try:
    sees = marker.read_text() == token
  except (OSError, FileNotFoundError):
    sees = False
  seen = client.exchange(f'{name}/sees', '1' if sees else '0')
  if client.process_index == 0:
    marker.unlink()
  blind = sorted(i for i, v in seen.items() if v != '1')
  if blind:
    raise CheckpointError(
        f'the checkpoint directory {path} is not shared: process(es) '
        f'{blind} of {client.process_count} cannot see the file {marker} that '
        'process 0 wrote there. Every process of a multi-process job must '
        'write to the same storage: use a shared file system or a bucket '
        '(for example --config.checkpoint_dir=gs://BUCKET/RUN/checkpoints on '
        'a TPU pod).')


def _write_marker(markers: epath.Path) -> str:
  """Process 0: a fresh token, written as markers/TOKEN; returns it."""
  token = uuid.uuid4().hex
  markers.mkdir(parents=True, exist_ok=True)
  (markers / token).write_text(token)
  return token


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
    >>> ckpt.latest_step()                              # None on a fresh start
    >>> ckpt.save(100, state, meta)                     # returns at once
    >>> ckpt.close()                                    # waits for the disk
  """

  def __init__(self, path: str, every: int, keep: int, async_save: bool = True):
    if keep < 1:
      raise ValueError(f'config.keep_checkpoints={keep}; keep at least 1')
    self.path = path
    self.every = every
    self._async = async_save
    self._thread: Optional[threading.Thread] = None
    self._saving: Optional[int] = None
    self._saving_since = 0.0
    self._queued_said = False
    self._error: Optional[BaseException] = None
    # Naming every process makes orbax meet at the coordination service's
    # barriers instead of at collectives over the devices, which a save on
    # a thread of its own would interleave with the steps' collectives (a
    # deadlock, measured on a 2 x 4 local pod). It leaves creating the
    # directory to us.
    epath.Path(path).mkdir(parents=True, exist_ok=True)
    self._manager = _Manager(
        path,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=False,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save,
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                active_processes=set(range(jax.process_count())))),
        item_names=('state', 'meta'))

  def latest_step(self) -> Optional[int]:
    self._join()
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    self._join()
    return list(self._manager.all_steps())

  def due(self, step: int) -> bool:
    """Whether `step` is one of the periodic checkpoint steps."""
    return self.every > 0 and step % self.every == 0

  def describe_save(self, step: int) -> str:
    """What a save of `step` works on, for the hang watchdog's message:
    its path, and the save still being written that it waits for."""
    target = f'saving step {step} to {self.path.rstrip("/")}/{step}'
    if self._thread is not None and self._thread.is_alive():
      target += (f', after the save of step {self._saving} to '
                 f'{self.path.rstrip("/")}/{self._saving} completes (is the '
                 'storage reachable?)')
    return target

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Starts saving `state` (host arrays, or global arrays nothing else
    uses: the step donates its own) as step `step`; returns at once.

    Does nothing when `step` is already saved. Orbax's own save call blocks
    for its set-up (directories, a barrier between processes, copies) before
    its asynchronous write starts; with async_save it runs on a thread of
    this class, so the training loop waits only for the copy to host.
    Every process makes its saves in the same order, so their threads meet
    at orbax's barriers as the main threads would.
    """
    self._wait_for_previous(step)
    if not self._async:
      self._save(step, state, meta)
      return
    self._saving, self._saving_since = step, time.perf_counter()
    self._thread = threading.Thread(target=self._save,
                                    args=(step, state, meta),
                                    name=f'checkpoint-{step}',
                                    daemon=True)
    self._thread.start()

  def _wait_for_previous(self, step: int) -> None:
    """Waits for the save still being written, if any; says once, with the
    figures and what to set, when a save had to queue behind the last."""
    if not self.saving():
      self._join()
      return
    started = time.perf_counter()
    self.wait()
    waited = time.perf_counter() - started
    if self._queued_said or waited < _QUEUE_SAID_FROM_S:
      return
    self._queued_said = True
    took = time.perf_counter() - self._saving_since
    step_s = local_cadence.recent_step_s()
    fix = ('' if not step_s else
           f'; saves that do not queue need checkpoint_every of at least '
           f'{math.ceil(took / step_s)} steps of {step_s:.3g} s')
    logging.warning(
        'the persistent save of step %d waited %.2f s for the save of step '
        '%d, which took %.2f s from its start: the saves queue and the loop '
        'waits (config.checkpoint_every=%d)%s', step, waited, self._saving,
        took, self.every, fix)

  def _save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    try:
      if step in self._manager.all_steps():
        return
      self._manager.save(step,
                         args=ocp.args.Composite(
                             state=ocp.args.StandardSave(state),
                             meta=ocp.args.JsonSave(meta)),
                         force=True)
    except BaseException as e:  # pylint: disable=broad-except
      self._error = e

  def _join(self) -> None:
    """Waits for the save call on this class's thread; raises its error."""
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    if self._error is not None:
      error, self._error = self._error, None
      raise error

  def meta(self, step: int) -> dict[str, Any]:
    """The 'meta' item saved with `step`: what recovery checks first."""
    self._join()
    return self._manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def load(self, step: int, like: Any, shardings: Any = None) -> Any:
    """The state saved as `step`, in the tree of `like`: host arrays, or
    global arrays placed by `shardings`.

    Reads what it is told: which step, and whether it fits this run, are
    recovery.restore's to decide (every process restores the step they
    agreed on, not each the newest it happens to see). Whoever wrote it
    (process 0 host arrays, or every process its shards), it restores
    either way, on any topology: each process reads only the parts its
    devices hold.

    Args:
      step: a step `all_steps()` lists.
      like: this run's initial state (a TrainState); its tree, shapes and
        dtypes.
      shardings: None for host arrays, or a TrainState of NamedShardings
        (a sharded state's).
    """
    self._join()
    if shardings is None:
      target = jax.tree.map(np.asarray, like)
    else:
      target = jax.tree.map(
          lambda x, sharding: jax.ShapeDtypeStruct(
              np.shape(x), np.result_type(x), sharding=sharding), like,
          shardings)
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
    return type(like)(*restored.state)

  def saving(self) -> bool:
    """Whether a started save is still being written."""
    thread = self._thread
    return ((thread is not None and thread.is_alive()) or
            self._manager.is_saving_in_progress())

  def wait(self) -> None:
    """Blocks until every started save is complete on disk."""
    self._join()
    self._manager.wait_until_finished()

  def finish(self, timeout_s: float) -> bool:
    """Waits at most `timeout_s` for the started saves; whether they are
    complete. Errors are logged, not raised (the caller is failing)."""

    def wait():
      try:
        self.wait()
      except Exception as e:  # pylint: disable=broad-except
        logging.error('could not finish the checkpoint being written: %s', e)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(timeout_s)
    return not waiter.is_alive()

  def close(self) -> None:
    self.wait()
    self._manager.close()


def open_for(options: checkpoint_options.Checkpointing) -> Checkpoints:
  """The run's Checkpoints in `options.directory`, after checking every
  process shares that directory (its every, keep and async_save too)."""
  if options.directory.startswith('gs://'):
    gcs_auth.wait()  # Else epath and orbax's threads each search anew.
  check_shared(options.directory)
  return Checkpoints(options.directory,
                     every=options.every,
                     keep=options.keep,
                     async_save=options.async_save)


def read_state(step_dir: str) -> Any:
  """The 'state' item of one checkpoint as a TrainState of numpy arrays,
  whoever wrote it, on any machine (outside a job too).

  Args:
    step_dir: a checkpoint's directory, WORKDIR/checkpoints/STEP.

  Returns:
    runtime.step.TrainState: params, model_state, opt_state (as nested
    dicts: the optimiser's own types are not saved) and rng, each leaf a
    numpy array; `._asdict()` for a dict.

  Example:
    >>> state = read_state('/tmp/w/checkpoints/300')
    >>> state.params['dense']['kernel'].shape
    (784, 128)
  """
  from runtime import step  # pylint: disable=g-import-not-at-top
  item = epath.Path(step_dir) / 'state'
  reader = ocp.PyTreeCheckpointer()
  # The item has no metadata file of its own (the manager keeps the
  # step's): orbax would warn on every read of one.
  quiet = _Without('Metadata file does not exist')
  absl_logger = stdlib_logging.getLogger('absl')
  absl_logger.addFilter(quiet)
  try:
    # As numpy: without a target orbax would put a sharded state's arrays
    # back on the devices that saved them, which this process may lack.
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                            reader.metadata(item).item_metadata.tree)
    read = reader.restore(item, restore_args=as_numpy)
  finally:
    absl_logger.removeFilter(quiet)
  return step.TrainState(**read)


class _Without(stdlib_logging.Filter):
  """Drops the log records whose message starts with `start`."""

  def __init__(self, start: str):
    super().__init__()
    self._start = start

  def filter(self, record: stdlib_logging.LogRecord) -> bool:
    return not record.getMessage().startswith(self._start)


def refuse_existing(ckpt: Checkpoints) -> None:
  """config.restore=False: a directory that already holds checkpoints is
  refused rather than overwritten.

  Raises:
    CheckpointError: naming the directory and its steps.
  """
  if ckpt.all_steps():
    raise CheckpointError(
        f'config.restore=False, but {ckpt.path} already holds the '
        f'checkpoints of steps {ckpt.all_steps()}. Use a new --workdir (or '
        'config.checkpoint_dir) to start afresh, or drop '
        '--config.restore=False to resume.')


class _QuietOrbax(stdlib_logging.Filter):
  """Drops orbax's INFO lines (dozens per save); keeps its warnings.

  Run with --verbosity=1 to see them.
  """

  def filter(self, record: stdlib_logging.LogRecord) -> bool:
    return (record.levelno >= stdlib_logging.WARNING or
            f'{os.sep}orbax{os.sep}' not in record.pathname or
            logging.get_verbosity() > logging.INFO)


stdlib_logging.getLogger('absl').addFilter(_QuietOrbax())
