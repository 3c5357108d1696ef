"""A linear-regression workload that tests can make misbehave or report.

Config fields (see probe_config.py): `fail_rank` at `fail_step` (the step
whose batch is being loaded, 0-based) exits with `fail_code`, raises, or
sleeps forever, as `fail_mode` says (`'podrun_error'` raises a PodrunError
carrying `fail_code`, as a workload that chooses its exit code does);
`fail_mode='sleep'` pauses for `fail_seconds` and goes on; `fail_mode='slow'` pauses that long at every
step from `fail_step` on (a straggler); `record_ids` saves which example ids
each rank loaded to WORKDIR/ids/rank_<i>.npy, shape (steps, ids per rank);
`ballast_floats` adds an untrained parameter of that many random floats, to make
checkpoints big enough to be caught mid-save; `per_rank_checkpoint_dir` gives
each rank a checkpoint directory of its own, as host-local disks would, and
`per_rank_local_dir` a local tier of its own (LOCAL_DIR/host_<i>), as
processes on hosts of their own have;
`fail_once` misbehaves only in the first run in a workdir; `flip_rank`
flips one bit of the first parameter on its local device `flip_device` after
step `flip_step`, as silent data corruption would; `fail_mode='sigkill'`
SIGKILLs the rank, as the OOM killer would; `kill_in_local_save` SIGKILLs
`fail_rank` halfway through writing its local copy of that step;
`eval_seconds` makes an evaluation (every `eval_every` steps) that takes so
long; `nan_on_padding` makes the loss NaN when a row of zeros (a layout's
padding, runtime/parallelism/microbatches.py) reaches it; `log_ids` appends
each load's example ids, as it happens, to
WORKDIR/ids/<attempt>/rank_<i>.jsonl (one line a load, so a SIGKILLed
attempt keeps what it read); `step_seconds` sleeps after every step, to
pace the job as a longer step would; `device_example_seconds` sleeps that
long for each example of a device's share of the global batch
(global_batch_size / device count), so that a job on fewer devices takes
longer steps, as devices that compute would; `slow_below_seconds` more in an
attempt of fewer than `slow_below_processes` processes (an elastic job's
reduced size lasting until it grows back, whatever the machine's speed);
`census` adds parameters that count every example and step trained
(tests/workloads/census.py); `fail_at_step` misbehaves as `fail_mode` says
on `fail_rank` right after the step of that number, in every attempt that
trains it (a failure that comes back at the same step).
"""

import dataclasses
import json
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict
import numpy as np

from runtime.common import handoff
from runtime.common import exit_codes
from runtime import data as data_lib
from runtime import hooks
from runtime.checkpoints import local_checkpoint
from runtime import training
from runtime.workloads import linear_regression
from tests.workloads import census


def _misbehave(config: ConfigDict) -> None:
  print(f'probe: {config.fail_mode} at {time.time():.6f}', flush=True)
  if config.fail_mode == 'exit':
    sys.exit(config.fail_code)
  if config.fail_mode == 'raise':
    raise RuntimeError(f'probe: rank {jax.process_index()} raises on purpose')
  if config.fail_mode == 'podrun_error':
    raise exit_codes.PodrunError(
        f'probe: rank {jax.process_index()} chooses exit code '
        f'{config.fail_code}',
        exit_code=config.fail_code)
  if config.fail_mode == 'sigkill':
    os.kill(os.getpid(), signal.SIGKILL)
  if config.fail_mode == 'hang':
    time.sleep(3600)
  if config.fail_mode in ('sleep', 'slow'):
    time.sleep(config.fail_seconds)
    return
  raise ValueError(f'unknown fail_mode {config.fail_mode!r}')


class _Pace(hooks.Hook):
  """Sleeps `seconds` for every step of the call just made (several with
  config.steps_per_dispatch), as that many longer steps would."""

  def __init__(self, seconds: float):
    self.seconds, self.count = seconds, 0

  def after_step(self, run) -> None:
    time.sleep(self.seconds * (run.count - self.count))
    self.count = run.count


class _Misbehave(hooks.Hook):
  """Misbehaves (config.fail_mode) after the call that runs
  config.fail_at_step."""

  def __init__(self, config):
    self.config, self.last = config, 0

  def begin(self, run) -> None:
    self.last = run.step

  def after_step(self, run) -> None:
    ran, self.last = (self.last, run.step), run.step
    if ran[0] < self.config.fail_at_step <= ran[1]:
      _misbehave(self.config)


def train_and_evaluate(config: ConfigDict, workdir):
  if config.echo_env:
    print(
        f'probe: env {config.echo_env}='
        f'{os.environ.get(config.echo_env, "<unset>")}',
        flush=True)
  task, dataset = linear_regression.make_task(config)
  source = task.data
  if config.data.get('grain'):
    source = _grain_pipeline(source, config.seed)
  seen = []

  once_marker = os.path.join(workdir, f'probe_failed_rank_{config.fail_rank}')

  id_log = _id_log(workdir) if config.log_ids else None

  def load_examples(ids):
    if id_log is not None:
      id_log.write(json.dumps([int(i) for i in ids]) + '\n')
      id_log.flush()
    if config.fail_mode == 'slow' and jax.process_index() == config.fail_rank:
      if len(seen) >= config.fail_step:
        time.sleep(config.fail_seconds)
    elif (jax.process_index() == config.fail_rank and
          len(seen) == config.fail_step and
          not (config.fail_once and os.path.exists(once_marker))):
      if config.fail_once:
        open(once_marker, 'w').close()
      _misbehave(config)
    seen.append(np.array(ids))
    return data_lib.read_batch(source, ids)

  params = dict(task.params)
  if config.ballast_floats:
    # Random, so that compression does not shrink it away.
    params['ballast'] = np.random.default_rng(7).standard_normal(
        config.ballast_floats, np.float32)
  if config.kill_in_local_save and jax.process_index() == config.fail_rank:
    _kill_in_local_save(config.kill_in_local_save, once_marker, config)
  if config.per_rank_checkpoint_dir:
    config.checkpoint_dir = os.path.join(
        workdir, f'checkpoints_rank_{jax.process_index()}')
  if config.per_rank_local_dir:
    config.local_checkpoint_dir = os.path.join(local_checkpoint.default_root(),
                                               f'host_{jax.process_index()}')
  extra_hooks = []
  if config.step_seconds:  # In the loop, so the ledger books it productive.
    extra_hooks.append(_Pace(config.step_seconds))
  if config.device_example_seconds:
    per_device = config.global_batch_size / jax.device_count()
    extra_hooks.append(_Pace(config.device_example_seconds * per_device))
  if jax.process_count() < config.slow_below_processes:
    extra_hooks.append(_Pace(config.slow_below_seconds))
  if config.fail_at_step and config.fail_rank == jax.process_index():
    extra_hooks.append(_Misbehave(config))
  if config.flip_rank == jax.process_index():
    extra_hooks.append(
        hooks.Periodic(
            config.flip_step,
            lambda run: flip_bit(run, config.flip_step, config.flip_device)))
  evaluate = (_slow_evaluation(config.eval_seconds)
              if config.eval_seconds else None)
  loss_fn = _nan_on_padding(
      task.loss_fn) if config.nan_on_padding else (task.loss_fn)
  task = dataclasses.replace(task,
                             params=params,
                             loss_fn=loss_fn,
                             data=_Source(len(source), load_examples, source),
                             hooks=list(task.hooks) + extra_hooks,
                             eval_fn=evaluate)
  if config.census:
    task = census.add(task, config.global_batch_size)
  result = training.train(config, workdir, task)
  if config.record_ids:
    os.makedirs(os.path.join(workdir, 'ids'), exist_ok=True)
    np.save(os.path.join(workdir, 'ids', f'rank_{jax.process_index()}.npy'),
            np.stack(seen))
  result.extra = {
      'learned_weight': result.params['weight'],
      'learned_bias': result.params['bias'],
      'true_weight': dataset['true_weight']
  }
  return result


def _id_log(workdir: str):
  """This process's ids log of this attempt, opened for appending."""
  attempt = os.environ.get(handoff.ATTEMPT, 'unnamed')
  folder = os.path.join(workdir, 'ids', attempt)
  os.makedirs(folder, exist_ok=True)
  return open(os.path.join(folder, f'rank_{jax.process_index()}.jsonl'), 'a')


def _nan_on_padding(loss_fn):

  def poisoned(params, batch):
    loss, metrics = loss_fn(params, batch)
    padded = jnp.any(jnp.all(batch['x'] == 0, axis=-1))
    return jnp.where(padded, jnp.nan, loss), metrics

  return poisoned


def _slow_evaluation(seconds: float):

  def evaluate(params, model_state):  # A long evaluation, nothing else.
    del params, model_state
    time.sleep(seconds)
    return {'seconds': seconds}

  return evaluate


def _kill_in_local_save(step: int, once_marker: str, config) -> None:
  """SIGKILLs this process with its local copy of `step` half written."""
  if config.fail_once and os.path.exists(once_marker):
    return
  write = local_checkpoint.np.savez

  def torn_write(path, **arrays):
    if f'{local_checkpoint._TMP_PREFIX}{step}' not in str(path):  # pylint: disable=protected-access
      return write(path, **arrays)
    if config.fail_once:
      open(once_marker, 'w').close()
    with open(path, 'wb') as f:
      f.write(b'PK\x03\x04 torn')
    print(f'probe: sigkill in the local save of step {step}', flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

  local_checkpoint.np.savez = torn_write


def flip_bit(run, step: int, device: int) -> None:
  """Flips the lowest bit of element 0 of the first parameter, on one local
  device's copy (or part, for a sharded state) only, once, at `step`."""
  if run.step != step:
    return
  state = run.state
  path_leaves = jax.tree_util.tree_leaves_with_path(state.params)
  leaf = path_leaves[0][1]
  shards = [s.data for s in leaf.addressable_shards]
  bad = np.array(shards[device]).reshape(-1).view(np.uint32)
  bad[0] ^= 1
  shards[device] = jax.device_put(
      bad.view(leaf.dtype).reshape(shards[device].shape),
      leaf.addressable_shards[device].device)
  flipped = jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding,
                                                     shards)
  params = jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(state.params),
      [flipped] + [x for _, x in path_leaves[1:]])
  run.state = state._replace(params=params)


def _grain_pipeline(arrays, seed: int):
  """grain.MapDataset.source(arrays).map(...).random_map(...): each
  record's x jittered by its own draw, which grain derives from the seed and
  the record's index alone."""
  import grain  # pylint: disable=g-import-not-at-top

  def jitter(example, rng):
    noise = rng.normal(size=example['x'].shape).astype(np.float32)
    return {**example, 'x': example['x'] + 1e-3 * noise}

  return (grain.MapDataset.source(arrays).map(lambda e: {
      k: np.asarray(v) for k, v in e.items()
  }).random_map(jitter, seed=seed))


class _Source:
  """A data source that reads through `read_batch(ids)`."""

  def __init__(self, size, read_batch, source=None):
    self.size, self.read_batch, self._source = size, read_batch, source

  def __getitem__(self, index):
    # The runtime's look at one example's shapes (runtime.data
    # first_example), never a step's read: not recorded.
    return self._source[index]

  def __len__(self):
    return self.size
