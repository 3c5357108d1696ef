"""The loop's hooks: cadence, resume, a profiler window, model state."""

import contextlib
import dataclasses
import glob
import signal
import types

import jax
import numpy as np
import optax
import pytest

from configs import linear_regression as linear_regression_config
from runtime.common import exit_codes
from runtime import data
from runtime import hooks
from runtime import parallelism
from runtime import step as step_lib
from runtime import training
from runtime.workloads import linear_regression
from tests import helpers

pytestmark = pytest.mark.devices


class _Recorder(hooks.Periodic):
  """Records the steps it ran at and the parameters it saw then."""

  def __init__(self, every):
    super().__init__(every)
    self.steps, self.began = [], []

  def begin(self, run):
    self.began.append(run.start_step)

  def work(self, run):
    self.steps.append(run.step)
    assert run.numpy_state().params['weight'].shape == (3,)


def _config(steps, **fields):
  config = linear_regression_config.get_config()
  config.steps, config.log_every, config.checkpoint_every = steps, 5, 4
  config.update(fields)
  return config


def _train(config, workdir, *user_hooks):
  task, _ = linear_regression.make_task(config)
  return training.train(config, str(workdir),
                        dataclasses.replace(task, hooks=user_hooks))


def test_a_user_hook_keeps_its_cadence_across_a_resume(tmp_path):
  first, second = _Recorder(3), _Recorder(3)
  _train(_config(7), tmp_path, first)
  resumed = _train(_config(13), tmp_path, second)
  assert resumed.start_step == 7
  assert first.steps == [3, 6] and second.steps == [9, 12]
  assert first.began == [0] and second.began == [7]


def test_periodic_due_steps():

  class FakeRun:
    steps = 10

    def __init__(self, step):
      self.step, self.final = step, step == 10

  every_4 = hooks.Periodic(4, at_end=True)
  assert [s for s in range(1, 11) if every_4.due(FakeRun(s))] == [4, 8, 10]
  never = hooks.Periodic(0)
  assert not any(never.due(FakeRun(s)) for s in range(1, 11))
  with pytest.raises(ValueError, match='every=-1'):
    hooks.Periodic(-1)


def test_a_hook_error_stops_the_run_and_the_others_still_end(tmp_path):
  ended = []

  class Ends(hooks.Hook):

    def end(self, run, error):
      ended.append(type(error).__name__)

  def fail(run):
    raise RuntimeError(f'hook fails at step {run.step}')

  with pytest.raises(RuntimeError, match='hook fails at step 2'):
    _train(_config(6), tmp_path, Ends(), hooks.Periodic(2, fail))
  assert ended == ['RuntimeError']


def test_a_failed_begin_still_ends_the_hooks_that_began(tmp_path):
  # The preemption notice's hook begins before the user's and installs a
  # SIGTERM handler: a failing begin after it must not leave that handler
  # in the process.
  before = signal.getsignal(signal.SIGTERM)
  ended = []

  class Ends(hooks.Hook):

    def end(self, run, error):
      ended.append(type(error).__name__)

  class FailsToBegin(hooks.Hook):

    def begin(self, run):
      raise RuntimeError('cannot begin')

    def end(self, run, error):
      ended.append('never began')

  with pytest.raises(RuntimeError, match='cannot begin'):
    _train(_config(6, checkpointing=False), tmp_path, Ends(), FailsToBegin())
  assert ended == ['RuntimeError']
  assert signal.getsignal(signal.SIGTERM) == before


def test_the_learning_rate_is_logged_from_the_schedule(tmp_path):
  config = _config(6, log_every=2, checkpointing=False)
  task, _ = linear_regression.make_task(config)
  schedule = optax.linear_schedule(0.1, 0.0, 10)
  task = dataclasses.replace(task,
                             optimizer=optax.sgd(schedule),
                             schedule=schedule)
  training.train(config, str(tmp_path), task)
  records = helpers.read_jsonl(tmp_path / 'metrics.jsonl')
  # The rate of each window's last update: optax counts from 0.
  assert [r['learning_rate'] for r in records
         ] == pytest.approx([0.09, 0.07, 0.05])


def test_a_profile_window_writes_a_trace(tmp_path):
  config = _config(6, checkpointing=False)
  config.profile.start_step, config.profile.num_steps = 2, 2
  _train(config, tmp_path)
  traces = glob.glob(
      str(tmp_path / 'tensorboard' / 'plugins' / 'profile' / '*' /
          '*.xplane.pb'))
  assert len(traces) == 1, traces


def test_model_state_is_averaged_over_every_device():
  """Each device's new state is its batch mean; all hold the global mean."""
  assert jax.device_count() == 8

  def loss_fn(params, model_state, batch):
    del model_state
    loss = jax.numpy.mean((batch['x'] * params['w'])**2)
    return loss, ({}, {'mean': batch['x'].mean()})

  par = parallelism.PMAP
  optimizer = optax.sgd(0.0)
  step = step_lib.make_train_step(loss_fn, optimizer, par, has_model_state=True)
  state = par.replicate(
      step_lib.init_state({'w': np.float32(1)},
                          optimizer,
                          model_state={'mean': np.float32(0)}))
  x = np.arange(64, dtype=np.float32)  # Device i: rows 8i .. 8i + 7.
  state, _ = step(state, par.put_batch({'x': x}))
  per_device = [
      np.asarray(shard.data)
      for shard in state.model_state['mean'].addressable_shards
  ]
  assert len(per_device) == 8
  assert all(v == pytest.approx(x.mean()) for v in per_device), per_device


def test_array_source_and_a_per_example_source_read_the_same_batch():
  arrays = {
      'x': np.arange(20, dtype=np.float32).reshape(10, 2),
      'y': np.arange(10)
  }
  source = data.ArraySource(**arrays)

  class PerExample:  # Only __len__ and __getitem__, as a grain MapDataset.

    def __len__(self):
      return 10

    def __getitem__(self, i):
      return {'x': arrays['x'][i], 'y': arrays['y'][i]}

  ids = np.array([7, 2, 2, 9])
  by_batch = data.read_batch(source, ids)
  by_example = data.read_batch(PerExample(), ids)
  for k in arrays:
    np.testing.assert_array_equal(by_batch[k], by_example[k])
  with pytest.raises(ValueError, match="'x': 10, 'y': 9"):
    data.ArraySource(x=arrays['x'], y=arrays['y'][:9])


def test_the_loop_trains_from_a_per_example_source(tmp_path):
  config = _config(5, checkpointing=False)
  task, _ = linear_regression.make_task(config)
  arrays = task.data.arrays

  class PerExample:

    def __len__(self):
      return len(arrays['x'])

    def __getitem__(self, i):
      return {'x': arrays['x'][i], 'y': arrays['y'][i]}

  by_batch = training.train(config, str(tmp_path / 'a'), task)
  by_example = training.train(config, str(tmp_path / 'b'),
                              dataclasses.replace(task, data=PerExample()))
  assert by_batch.fingerprint == by_example.fingerprint


class _FakeCheckpoints:
  every = 2

  def __init__(self, events):
    self.events = events

  def due(self, step):
    return step % self.every == 0

  def save(self, step, state, meta):
    self.events.append(('save', step))

  def describe_save(self, step):
    return f'saving step {step}'

  def wait(self):
    self.events.append(('wait',))


def _fake_run(step):
  clock = types.SimpleNamespace(timing=lambda _: contextlib.nullcontext())
  writer = types.SimpleNamespace(flush=lambda: None)
  return types.SimpleNamespace(step=step,
                               final=False,
                               clock=clock,
                               writer=writer,
                               numpy_state=lambda: {},
                               drain=lambda: None,
                               saved_state=lambda: {})


def test_a_save_runs_the_replica_check_of_its_step_first_in_any_order():
  events = []

  class Check(hooks.Periodic):

    def work(self, run):
      events.append(('check', run.step))

  check = Check(2)
  save = hooks.SaveCheckpoints(_FakeCheckpoints(events),
                               lambda run, state, reason: {},
                               checks=[check])
  for step in (1, 2, 3, 4):
    run = _fake_run(step)
    save.after_step(run)  # The save's hook first: the check comes anyway,
    check.after_step(run)  # and only once per step.
  assert events == [('check', 2), ('save', 2), ('check', 4), ('save', 4)]
  save.save_and_wait(_fake_run(5), 'preemption')
  assert events[-2:] == [('save', 5), ('wait',)]


class _ReadsTheRun(hooks.Periodic):
  """What a hook reads of the run: the typed options, and the old config."""

  def __init__(self):
    super().__init__(every=0, at_end=True)
    self.seen = []

  def work(self, run):
    with pytest.warns(DeprecationWarning, match='run.options'):
      old = run.config.global_batch_size
    self.seen.append((run.options.steps, run.options.logging.every,
                      run.options.data.global_batch_size, old,
                      run.options.checkpointing.every))


def test_a_hook_reads_the_options_train_read_once(tmp_path):
  reader = _ReadsTheRun()
  config = _config(6)
  _train(config, tmp_path, reader)
  assert reader.seen == [(6, 5, config.global_batch_size,
                          config.global_batch_size, 4)]


def _lm1b_schedule(learning_rate: float, warmup_steps: int):
  """Flax's LM1B schedule: linear warmup, then rsqrt, joined by optax."""

  def rsqrt(count):
    return learning_rate * (count + warmup_steps)**-0.5 * warmup_steps**0.5

  return optax.join_schedules(
      [optax.linear_schedule(0.0, learning_rate, warmup_steps), rsqrt],
      boundaries=[warmup_steps])


def test_the_logged_rate_calls_the_schedule_as_optax_does():
  # With a Python int the rsqrt branch raised ZeroDivisionError at step 1.
  schedule = _lm1b_schedule(0.0016, 1000)
  assert hooks.learning_rate(schedule, 1) == 0.0
  assert hooks.learning_rate(schedule, 1001) == pytest.approx(0.0016)

  def broken(count):
    raise ValueError('no rate')

  with pytest.raises(exit_codes.ConfigError,
                     match=r'Task.schedule .*broken failed at count 4 .*'
                     r'logging step 5.*ValueError: no rate'):
    hooks.learning_rate(broken, 5)
