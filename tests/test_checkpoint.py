"""Checkpoints in one process of 8 devices: exact resume, refusals, metrics."""

import dataclasses
import json
import os
import time

import jax
import numpy as np
import pytest

from configs import linear_regression as linear_regression_config
from configs import mlp as mlp_config
from runtime.checkpoints import checkpoint
from runtime.checkpoints import options as checkpoint_options
from runtime import data
from runtime import metrics
from runtime import training
from runtime.workloads import linear_regression
from runtime.workloads import mlp

pytestmark = pytest.mark.devices


def _config(steps, **fields):
  config = mlp_config.get_config()
  config.steps = steps
  config.log_every = 1
  config.checkpoint_every = 4
  config.keep_checkpoints = 2
  for name, value in fields.items():
    section, _, field = name.rpartition('.')
    (config[section] if section else config)[field] = value
  return config


def _train(config, workdir):
  task, _ = mlp.make_task(config)
  return training.train(config, str(workdir), task)


def _records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def test_resume_is_exact_on_8_devices(tmp_path):
  assert jax.device_count() == 8
  # Adam: the optimiser state (moments, step count) must come back too.
  straight = _train(_config(14), tmp_path / 'straight')
  first = _train(_config(7), tmp_path / 'resumed')
  resumed = _train(_config(14), tmp_path / 'resumed')
  assert first.start_step == 0 and resumed.start_step == 7
  assert resumed.fingerprint == straight.fingerprint
  # One record per step, none missing or repeated, and the same numbers.
  straight_records = _records(tmp_path / 'straight')
  resumed_records = _records(tmp_path / 'resumed')
  assert [r['step'] for r in resumed_records] == list(range(1, 15))
  assert ([r['loss'] for r in resumed_records
          ] == [r['loss'] for r in straight_records])
  assert checkpoint.Checkpoints(str(tmp_path / 'resumed' / 'checkpoints'),
                                every=4,
                                keep=2).all_steps() == [12, 14]


def test_the_rng_key_is_saved_and_restored(tmp_path):
  config = _config(6)
  result = _train(config, tmp_path)
  ckpt = checkpoint.Checkpoints(str(tmp_path / 'checkpoints'), every=4, keep=2)
  like = training.step_lib.init_state(*_params_and_optimizer(config),
                                      config.seed)
  step = ckpt.latest_step()
  state, meta = ckpt.load(step, like), ckpt.meta(step)
  ckpt.close()
  assert step == 6 and meta['step'] == 6 and meta['reason'] == 'final'
  # Six splits of the seed's key, as the step does them.
  key = jax.random.key(config.seed)
  for _ in range(6):
    key, _ = jax.random.split(key)
  np.testing.assert_array_equal(state.rng, jax.random.key_data(key))
  assert meta['data'] == {
      'examples_consumed':
          6 * config.global_batch_size,
      'epoch':
          6 * config.global_batch_size // config.data.num_examples,
      'examples_into_epoch':
          6 * config.global_batch_size % config.data.num_examples,
      'num_examples':
          config.data.num_examples,
      'seed':
          config.seed
  }
  assert result.start_step == 0


def _params_and_optimizer(config):
  task, _ = mlp.make_task(config)
  return task.params, task.optimizer


def test_a_finished_run_is_not_trained_again(tmp_path, caplog):
  done = _train(_config(5), tmp_path)
  records = (tmp_path / 'metrics.jsonl').read_text()
  with caplog.at_level('WARNING'):
    again = _train(_config(5), tmp_path)
  assert again.start_step == 5 and not again.trained and done.trained
  assert again.fingerprint == done.fingerprint
  assert again.final_metrics == {} and again.steps == 5
  said = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert any(
      m.startswith('nothing to train: the checkpoint in ') and
      'is already at step 5 of config.steps=5' in m and
      'another --workdir' in m and 'raise --config.steps' in m
      for m in said), said
  # Nothing trained, nothing logged: the record is the trained run's.
  assert (tmp_path / 'metrics.jsonl').read_text() == records


def test_restore_refuses_a_different_config_and_names_both_values(tmp_path):
  _train(_config(4), tmp_path)
  with pytest.raises(checkpoint.CheckpointError) as e:
    _train(
        _config(8, **{'optimizer.learning_rate': 0.5}, global_batch_size=128),
        tmp_path)
  message = str(e.value)
  assert ('config.optimizer.learning_rate: checkpoint 0.01, this run 0.5'
          in message), message
  assert 'config.global_batch_size: checkpoint 512, this run 128' in message
  assert str(tmp_path / 'checkpoints' / '4') in message


def test_restore_refuses_other_shapes_and_names_the_arrays(tmp_path):
  config = linear_regression_config.get_config()
  config.steps = 3
  training.train(config, str(tmp_path), linear_regression.make_task(config)[0])
  config.data.features = 5
  config.steps = 6
  config.restore_may_change = ('data.features',)
  with pytest.raises(checkpoint.CheckpointError) as e:
    training.train(config, str(tmp_path),
                   linear_regression.make_task(config)[0])
  assert ("state.params['weight']: checkpoint shape (3,) float32, this run "
          'shape (5,) float32') in str(e.value), str(e.value)


def test_changing_run_control_fields_is_allowed(tmp_path):
  _train(_config(4), tmp_path)
  resumed = _train(
      _config(6,
              log_every=3,
              checkpoint_every=5,
              keep_checkpoints=1,
              max_steps_in_flight=2), tmp_path)
  assert resumed.start_step == 4


def test_restore_false_refuses_a_directory_with_checkpoints(tmp_path):
  _train(_config(4), tmp_path)
  with pytest.raises(checkpoint.CheckpointError,
                     match=r'config.restore=False, but .* holds the '
                     r'checkpoints of steps \[4\]'):
    _train(_config(4, restore=False), tmp_path)


def test_checkpointing_can_be_turned_off(tmp_path):
  _train(_config(4, checkpointing=False), tmp_path)
  assert not (tmp_path / 'checkpoints').exists()


def test_keep_records_up_to_drops_later_and_torn_lines(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"ste')
  assert metrics.keep_records_up_to(str(path), 2) == 2
  assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


def test_trajectory_config_leaves_out_run_control_fields():
  config = _config(10, restore_may_change=('model.hidden',))
  flat = checkpoint_options.trajectory_config(config)
  assert 'optimizer.learning_rate' in flat and 'seed' in flat
  assert 'data.num_examples' in flat
  for key in ('steps', 'log_every', 'checkpoint_every', 'topology.platform',
              'model.hidden', 'eval_every', 'profile.num_steps'):
    assert key not in flat


def test_a_run_control_field_added_later_needs_no_registration(tmp_path):
  config = _config(4)
  config.new_cadence = 1  # A field of the run, unknown to the runtime.
  _train(config, tmp_path)
  resumed = _config(6)
  resumed.new_cadence = 7
  assert _train(resumed, tmp_path).start_step == 4


def test_a_changed_model_field_is_still_refused(tmp_path):
  _train(_config(4), tmp_path)
  with pytest.raises(checkpoint.CheckpointError,
                     match=r'config.model.hidden: checkpoint 64, this run 32'):
    _train(_config(6, **{'model.hidden': 32}), tmp_path)


def test_restore_refuses_a_data_set_of_another_size(tmp_path):
  config = _config(4)
  task, _ = mlp.make_task(config)
  training.train(config, str(tmp_path), task)
  arrays = {k: v[:-1] for k, v in task.data.arrays.items()}
  smaller = dataclasses.replace(task, data=data.ArraySource(**arrays))
  with pytest.raises(checkpoint.CheckpointError,
                     match=r'made on 8192 training examples; this run has '
                     '8191'):
    training.train(_config(8), str(tmp_path), smaller)


def test_a_sharded_state_saves_and_loads_split_whole_or_split_otherwise(
    tmp_path):
  """Checkpoints.save of global arrays split over 2 replicas of 4 loads as
  host arrays, split over 1 of 8, and split the first way, bit for bit;
  host arrays saved load split; `read_state` reads both as numpy."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from runtime import step as step_lib  # pylint: disable=g-import-not-at-top
  devices = np.array(jax.devices())
  host = step_lib.TrainState(params={
      'kernel': np.arange(128, dtype=np.float32).reshape(16, 8) / 7,
      'bias': np.arange(3, dtype=np.float32)
  },
                             model_state={},
                             opt_state={'count': np.array(5, np.int32)},
                             rng=np.array([1, 2], np.uint32))
  specs = step_lib.TrainState({
      'kernel': P(None, 'shards'),
      'bias': P()
  }, {}, {'count': P()}, P())

  def shardings(replicas):
    grid = Mesh(devices.reshape(replicas, -1), ('replicas', 'shards'))
    return step_lib.state_shardings(grid, specs)

  ckpt = checkpoint.Checkpoints(str(tmp_path), every=1, keep=3)
  ckpt.save(1, jax.device_put(host, shardings(2)), {'step': 1})
  ckpt.save(2, host, {'step': 2})
  ckpt.wait()
  leaves = jax.tree_util.tree_leaves
  for step in (1, 2):
    for replicas in (None, 1, 2):
      placed = None if replicas is None else shardings(replicas)
      got = ckpt.load(step, host, placed)
      for a, b in zip(leaves(got), leaves(host), strict=True):
        assert np.array_equal(np.asarray(a), b), (step, replicas)
      for a, sharding in zip(leaves(got),
                             leaves(placed) if placed else [None] * 4,
                             strict=True):
        assert (isinstance(a, np.ndarray) if sharding is None else a.sharding
                == sharding), (step, replicas, a)
    # And read outside a run, as numpy, whoever wrote it.
    read = checkpoint.read_state(str(tmp_path / str(step)))
    assert np.array_equal(read.params['kernel'], host.params['kernel'])
    assert np.array_equal(read.rng, host.rng)
  ckpt.close()


def test_a_save_that_queues_behind_the_last_is_said_once(
    tmp_path, caplog, monkeypatch):
  ckpt = checkpoint.Checkpoints(str(tmp_path / 'ckpt'), every=10, keep=3)
  state = {'w': np.zeros(4, np.float32)}
  slow = [True]
  real_save = ckpt._save  # pylint: disable=protected-access

  def slow_save(step, state, meta):
    real_save(step, state, meta)
    if slow[0]:
      time.sleep(0.8)

  monkeypatch.setattr(ckpt, '_save', slow_save)
  monkeypatch.setattr(checkpoint.local_cadence, 'recent_step_s', lambda: 0.1)
  with caplog.at_level('WARNING'):
    ckpt.save(10, state, {})
    ckpt.save(20, state, {})
    ckpt.save(30, state, {})
    slow[0] = False
    ckpt.wait()
  said = [
      r.getMessage() for r in caplog.records if 'saves queue' in r.getMessage()
  ]
  assert len(said) == 1, said
  assert 'step 20 waited' in said[0] and 'save of step 10' in said[0]
  assert 'checkpoint_every=10' in said[0]
  assert 'at least' in said[0]
  assert ckpt.all_steps() == [10, 20, 30]
