"""Several steps per call (config.steps_per_dispatch) on 8 devices: the same
updates, data order, keys and metrics as one step per call."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from configs import linear_regression as linear_regression_config
from configs import mlp as mlp_config
import runtime
from runtime import dispatch
from runtime.common import exit_codes
from runtime import hooks
from runtime import plan
from runtime import training
from runtime.workloads import linear_regression
from runtime.workloads import mlp
from runtime.common import layout

pytestmark = pytest.mark.devices


def test_choose_takes_k_from_the_step_time_and_the_cadences():
  assert dispatch.choose(None, {'log_every': 10}) == 1
  assert dispatch.choose(0.010, {'log_every': 10}) == 1  # A slow step.
  assert dispatch.choose(0.001, {'log_every': 10}) == 10  # 40 ms wanted.
  assert dispatch.choose(0.0016, {'log_every': 100}) == 25
  assert dispatch.choose(0.001, {'log_every': 12}) == 12
  assert dispatch.choose(0.001, {'log_every': 10, 'eval_every': 25}) == 5
  assert dispatch.choose(0.001, {'log_every': 7}) == 7
  assert dispatch.choose(0.0001, {}) == dispatch.MOST_STEPS
  assert dispatch.choose(0.0001, {'log_every': 0, 'x': 96}) == 48


def test_choose_keeps_a_calls_batches_under_most_call_bytes():
  mib = 1 << 20
  assert dispatch.choose(0.0001, {}, step_bytes=mib) == 24
  assert dispatch.choose(0.0016, {'log_every': 100}, step_bytes=2 * mib) == 10
  # A step's batch over the limit alone still runs, one a call.
  assert dispatch.choose(0.0001, {}, step_bytes=64 * mib) == 1


def test_grow_takes_k_until_the_hosts_share_of_a_call_is_small():
  cadences = {'log_every': 1000}
  # 1.3 ms of host and 20 us of device a step: at 25 a call the host's
  # share is 0.72; 0.1 wants k = 587, at most 8 x 25.
  one, at_25 = 1.32e-3, 1.3e-3 / 25 + 20e-6
  assert dispatch.host_share(25, one, at_25) == pytest.approx((1.3e-3, 20e-6))
  assert dispatch.grow(25, one, at_25, cadences) == 200
  at_200 = 1.3e-3 / 200 + 20e-6
  assert dispatch.grow(200, one, at_200, cadences) == 1000
  # The cadences' divisors: the next larger that divides them.
  assert dispatch.grow(25, one, at_25, {'log_every': 100}) == 100
  # Nothing larger divides them, or no room for a larger call's batches.
  assert dispatch.grow(100, one, 1.3e-3 / 100 + 20e-6,
                       {'log_every': 100}) == 100
  assert dispatch.grow(25,
                       one,
                       at_25, {},
                       step_bytes=dispatch.MOST_CALL_BYTES // 30) == 30
  assert dispatch.grow(25,
                       one,
                       at_25,
                       cadences,
                       step_bytes=dispatch.MOST_CALL_BYTES // 30) == 25


def test_grow_keeps_k_where_the_host_is_not_what_a_call_waits_for():
  cadences = {'log_every': 1000}
  # The host's share already under HOST_SHARE: 40 us of host, 1 ms device.
  one = 40e-6 + 1e-3
  assert dispatch.grow(4, one, 10e-6 + 1e-3, cadences) == 4
  # A longer call that gained under MIN_GAIN, or was slower.
  assert dispatch.grow(25, 1e-3, 0.97e-3, cadences) == 25
  assert dispatch.grow(25, 1e-3, 1.2e-3, cadences) == 25
  assert dispatch.host_share(25, 1e-3, 1.2e-3) is None
  # Nothing measured.
  assert dispatch.grow(25, None, 1e-4, cadences) == 25


class _Looks:
  """An Auto whose decisions are given: first() and then again() in turn."""

  def __init__(self, first, *again):
    self._first, self._again = first, list(again)
    self.asked = []

  def first(self):
    self.asked.append(('first', None, None))
    return self._first

  def again(self, k, step):
    self.asked.append(('again', k, step))
    return self._again.pop(0)


def _cut(steps, auto, start=0, k=None):
  with dispatch.Dispatches(lambda first, n: (first, n),
                           start,
                           steps,
                           k,
                           auto,
                           size=1) as dispatches:
    cut, step = [], start
    while step < steps:
      n, batch, _ = dispatches.next(step)
      assert batch == (step, n)
      cut.append(n)
      step += n
  return cut


def test_auto_looks_again_at_multiples_of_k_while_k_grows(monkeypatch):
  monkeypatch.setattr(dispatch, 'REVIEW_CALLS', 2)
  looks = _Looks(4, 8, 8)
  cut = _cut(120, looks)
  # 20 one a call; 4 a call from step 20; looked at 28 (20 + 2 x 4): 8 a
  # call, first back in line at 32; looked at 48: 8 again, so no more.
  assert cut == [1] * 20 + [4, 4, 4, 8, 8] + [8] * 9
  assert sum(cut) == 120
  assert looks.asked == [('first', None, None), ('again', 4, 28),
                         ('again', 8, 48)]


def test_auto_stops_looking_after_most_reviews_or_a_slow_step(monkeypatch):
  monkeypatch.setattr(dispatch, 'REVIEW_CALLS', 1)
  monkeypatch.setattr(dispatch, 'MOST_REVIEWS', 2)
  looks = _Looks(2, 4, 8, 16)
  cut = _cut(200, looks)
  assert [a for a, _, _ in looks.asked] == ['first', 'again', 'again']
  assert sum(cut) == 200 and set(cut[-5:]) == {8}
  slow = _Looks(1)
  assert _cut(50, slow) == [1] * 50 and len(slow.asked) == 1
  # A fixed k never asks, and a resumed run measures from where it starts.
  assert _cut(20, _Looks(4), k=4) == [4] * 5
  resumed = _Looks(5, 5)
  # Back in line at 35 by two calls of the size already compiled.
  assert _cut(100, resumed, start=13)[:23] == [1] * 22 + [5]


def test_a_short_call_is_made_of_the_sizes_already_run():
  # MNIST's 2,344 steps at auto's 1, 25 and then 100 a call: the tail of
  # 44 runs as 25 and 19 ones, not as a new program of 44.
  known = {1, 25}
  assert [n for _, n in list(dispatch.cut(2200, 2344, 100, known))
         ] == ([100, 25] + [1] * 19)
  assert known == {1, 25, 100}
  # Where the known sizes do not add up, or take too many calls: the new
  # size, once, and from then on it is known.
  known = {100}
  assert [n for _, n in list(dispatch.cut(0, 244, 100, known))
         ] == [100, 100, 44]
  assert [n for _, n in list(dispatch.cut(0, 140, 100, {1}))] == [100, 40]
  known = {4}
  assert list(dispatch.cut(1, 9, 4, known)) == [(1, 3), (4, 4), (8, 1)]
  assert known == {1, 3, 4}


def test_a_k_that_grows_during_the_run_trains_as_one_step_a_call(
    tmp_path, monkeypatch):
  """'auto' on an accelerator, with its decisions given: 4 a call after
  step 20, then 8 from step 28 (calls of 4, 4, 4, 8 and a short one to get
  back in line), the same updates and losses as one step a call."""
  config = mlp_config.get_config()
  config.steps, config.log_every, config.integrity_every = 96, 8, 0
  config.checkpointing = False
  task, _ = mlp.make_task(config)
  config.steps_per_dispatch = 1
  one = training.train(config, str(tmp_path / 'one'), task)
  monkeypatch.setattr(dispatch, 'REVIEW_CALLS', 2)
  looks = _Looks(4, 8, 8)
  real = plan.calls

  def measured_first(made, task, hooks):
    real(made, task, hooks)  # Its checks of the cadences.
    return plan.Calls(None, looks)

  monkeypatch.setattr(plan, 'calls', measured_first)
  config.steps_per_dispatch = 0
  grown = training.train(config, str(tmp_path / 'grown'), task)
  assert [a for a, _, _ in looks.asked] == ['first', 'again', 'again']
  _assert_trained_alike(one, grown, tmp_path / 'one', tmp_path / 'grown')


def test_step_bytes_are_one_hosts_rows_of_a_step():
  task = runtime.Task(params={},
                      loss_fn=None,
                      optimizer=None,
                      data=runtime.ArraySource(image=np.zeros((10, 784),
                                                              np.float32),
                                               label=np.zeros(10, np.int32)))
  assert plan.step_bytes(task, 256) == 256 * (784 * 4 + 4)


def test_a_dispatch_runs_up_to_the_next_multiple_of_k():
  assert dispatch.size_at(0, 4, 100) == 4
  assert dispatch.size_at(6, 4, 100) == 2  # A resume in between: back in line.
  assert dispatch.size_at(96, 4, 98) == 2  # The last, shorter.


def test_stack_puts_each_devices_rows_of_every_step_together():
  step = lambda s: {'x': np.arange(4) + 10 * s}  # 2 devices of 2 rows.
  stacked = dispatch.stack([step(0), step(1), step(2)], local_devices=2)
  # Device 0: its rows of steps 0, 1, 2; then device 1's.
  np.testing.assert_array_equal(stacked['x'],
                                [0, 1, 10, 11, 20, 21, 2, 3, 12, 13, 22, 23])


@pytest.mark.parametrize('value', [-1, 2.5, 'fast', True])
def test_a_value_that_is_no_count_is_refused(value):
  with pytest.raises(dispatch.DispatchError, match='steps_per_dispatch'):
    dispatch.parse(value)


def test_a_count_given_as_a_flag_is_read():
  assert dispatch.parse('4') == 4 and dispatch.parse('auto') is None
  assert dispatch.parse(0) is None


def _records(workdir) -> list[dict]:
  with open(workdir / 'metrics.jsonl') as f:
    return [json.loads(line) for line in f]


def _assert_trained_alike(one, other, one_workdir, other_workdir) -> None:
  """Two runs' parameters agree to 1e-6, and so does every metrics
  record's loss, step by step."""
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
      one.params, other.params)
  for a, b in zip(_records(one_workdir), _records(other_workdir), strict=True):
    assert a['step'] == b['step']
    assert a['loss'] == pytest.approx(b['loss'], rel=1e-6)


@pytest.mark.parametrize('parallelism,state_layout',
                         [('pmap', 'replicated'), ('shard_map', 'replicated'),
                          ('shard_map', 'sharded')])
def test_four_steps_per_call_train_as_one(tmp_path, parallelism, state_layout):
  config = mlp_config.get_config()
  config.steps, config.log_every, config.integrity_every = 24, 4, 8
  config.parallelism, config.state_layout = parallelism, state_layout
  config.checkpointing = False
  task, _ = mlp.make_task(config)
  config.steps_per_dispatch = 1
  one = training.train(config, str(tmp_path / 'one'), task)
  config.steps_per_dispatch = 4
  four = training.train(config, str(tmp_path / 'four'), task)
  _assert_trained_alike(one, four, tmp_path / 'one', tmp_path / 'four')
  assert one.final_metrics['loss'] == pytest.approx(four.final_metrics['loss'],
                                                    rel=1e-6)


def test_dropout_draws_the_same_keys_in_a_call_of_several_steps(tmp_path):
  config = mlp_config.get_config()
  config.steps, config.log_every, config.checkpointing = 8, 4, False
  task, _ = mlp.make_task(config)
  base = task.loss_fn

  def loss_fn(params, batch, rng):
    keep = jax.random.bernoulli(rng[0], 0.5, (1,))  # Each example's key.
    loss, metrics = base(params, batch)
    return loss * (1.0 + keep[0]), metrics

  import dataclasses  # pylint: disable=g-import-not-at-top
  task = dataclasses.replace(task, loss_fn=loss_fn, rng='example')
  config.steps_per_dispatch = 1
  one = training.train(config, str(tmp_path / 'one'), task)
  config.steps_per_dispatch = 4
  four = training.train(config, str(tmp_path / 'four'), task)
  assert one.fingerprint == four.fingerprint or jax.tree_util.tree_all(
      jax.tree_util.tree_map(
          lambda a, b: np.allclose(a, b, rtol=1e-6, atol=1e-7), one.params,
          four.params))


def test_a_resume_between_multiples_gets_back_in_line(tmp_path):
  """6 steps one per call, then to 22 four per call (2, 4, 4, 4, 2): the
  run that never stopped, with a checkpoint at step 6."""
  config = linear_regression_config.get_config()
  config.log_every, config.checkpoint_every = 2, 2
  task, _ = linear_regression.make_task(config)
  config.steps, config.steps_per_dispatch = 22, 1
  straight = training.train(config, str(tmp_path / 'straight'), task)
  config.steps = 6
  training.train(config, str(tmp_path / 'resumed'), task)
  config.steps, config.steps_per_dispatch = 22, 4
  config.log_every, config.checkpoint_every = 4, 4
  config.local_checkpoint_every = 4
  resumed = training.train(config, str(tmp_path / 'resumed'), task)
  assert resumed.start_step == 6
  assert resumed.fingerprint == straight.fingerprint or np.allclose(
      resumed.params['weight'], straight.params['weight'], rtol=1e-6)
  steps = [r['step'] for r in _records(tmp_path / 'resumed') if 'loss' in r]
  assert steps == [2, 4, 6, 8, 12, 16, 20, 22]


def test_a_cadence_that_is_not_a_multiple_is_refused_before_step_1(tmp_path):
  config = linear_regression_config.get_config()
  config.steps, config.steps_per_dispatch = 8, 4
  config.log_every, config.integrity_every = 10, 6
  task, _ = linear_regression.make_task(config)
  with pytest.raises(dispatch.DispatchError) as refused:
    training.train(config, str(tmp_path), task)
  message = str(refused.value)
  assert 'integrity_every=6' in message and 'log_every=10' in message
  assert 'steps_per_dispatch=4' in message
  assert not (tmp_path / 'metrics.jsonl').exists()


def test_a_tasks_periodic_hook_is_a_cadence_too(tmp_path):
  config = linear_regression_config.get_config()
  config.steps, config.steps_per_dispatch, config.log_every = 8, 4, 4
  config.checkpoint_every = config.local_checkpoint_every = 4
  task, _ = linear_regression.make_task(config)
  seen = []
  hook = hooks.Periodic(every=3, callback=lambda run: seen.append(run.step))
  import dataclasses  # pylint: disable=g-import-not-at-top
  with pytest.raises(dispatch.DispatchError, match=r'Periodic\(every\)=3'):
    training.train(config, str(tmp_path / 'refused'),
                   dataclasses.replace(task, hooks=(hook,)))
  hook = hooks.Periodic(every=8, callback=lambda run: seen.append(run.step))
  training.train(config, str(tmp_path / 'runs'),
                 dataclasses.replace(task, hooks=(hook,)))
  assert seen == [8]


def test_auto_is_one_step_per_call_on_a_cpu(tmp_path, monkeypatch):
  config = linear_regression_config.get_config()
  config.steps = 4
  assert config.steps_per_dispatch == 0  # Auto.
  task, _ = linear_regression.make_task(config)
  made = plan.make(config, layout.Record(str(tmp_path)), task)
  # The hooks whose cadences a call must end on: log 20, integrity 100.
  kept = [
      hooks.LogMetrics(config.log_every),
      training.integrity.CheckReplicas(config.integrity_every, list)
  ]
  assert made.topology.platform == 'cpu'
  assert plan.calls(made, task, kept).per_dispatch == 1
  on_tpu = dataclasses.replace(made,
                               topology=dataclasses.replace(made.topology,
                                                            platform='tpu'))
  calls = plan.calls(on_tpu, task, kept)
  assert calls.per_dispatch is None  # Measured first on an accelerator.
  # Then a fast step, and room for 3 steps' batches a call: of the cadences'
  # divisors (log 20, integrity 100) that leaves 2.
  monkeypatch.setattr(plan.local_cadence,
                      'recent_step_s',
                      lambda last=None: 1e-4)
  monkeypatch.setattr(dispatch, 'MOST_CALL_BYTES',
                      3 * plan.step_bytes(task, made.rows_per_process))
  assert (config.log_every, config.integrity_every) == (20, 100)
  assert calls.auto.first() == 2


def test_a_call_of_several_steps_reports_their_mean_interval(tmp_path):
  # What the local tier's budget and the hang deadline learn from.
  from runtime.common import progress  # pylint: disable=g-import-not-at-top
  config = linear_regression_config.get_config()
  config.steps, config.steps_per_dispatch, config.log_every = 64, 8, 8
  config.checkpointing, config.integrity_every = False, 64
  task, _ = linear_regression.make_task(config)
  training.train(config, str(tmp_path), task)
  seconds = progress.snapshot().step_seconds
  assert seconds and min(seconds) > 0, seconds


@pytest.mark.parametrize('parallelism,k,global_batch_size',
                         [('pmap', 1, 512), ('pmap', 4, 500),
                          ('shard_map', 4, 512), ('shard_map', 1, 500)])
def test_data_kept_on_the_devices_trains_as_data_from_the_host(
    tmp_path, parallelism, k, global_batch_size):
  """config.data.on_device: the same batches, so the same losses and
  parameters, with several steps a call and with a padded layout (500
  examples on 8 devices: 504 rows)."""
  config = mlp_config.get_config()
  config.steps, config.log_every, config.integrity_every = 12, 4, 0
  config.parallelism, config.checkpointing = parallelism, False
  config.global_batch_size, config.steps_per_dispatch = global_batch_size, k
  task, _ = mlp.make_task(config)
  host = training.train(config, str(tmp_path / 'host'), task)
  config.data.on_device = True
  device = training.train(config, str(tmp_path / 'device'), task)
  _assert_trained_alike(host, device, tmp_path / 'host', tmp_path / 'device')


def test_data_on_the_devices_needs_arrays_in_memory(tmp_path):
  config = mlp_config.get_config()
  config.steps, config.checkpointing, config.data.on_device = 4, False, True
  task, dataset = mlp.make_task(config)
  examples = [{
      'x': x,
      'label': y
  } for x, y in zip(dataset['x'], dataset['label'])]
  import dataclasses  # pylint: disable=g-import-not-at-top
  task = dataclasses.replace(task, data=examples)
  with pytest.raises(exit_codes.ConfigError,
                     match='needs its arrays in memory as a '
                     'runtime.ArraySource; this task.s data is a list'):
    training.train(config, str(tmp_path), task)


def test_data_on_the_devices_must_fit_beside_the_state():
  from runtime import device_data  # pylint: disable=g-import-not-at-top
  device_data.check_fits(10 << 30, None)  # A CPU says no limit.
  device_data.check_fits(7 << 30, {'bytes_limit': 16 << 30})
  with pytest.raises(device_data.DeviceDataError,
                     match='the data set is 9.00 GiB and a device has 16.00 '
                     'GiB, of which it may take 50%'):
    device_data.check_fits(9 << 30, {'bytes_limit': 16 << 30})


def test_left_unset_the_data_goes_to_an_accelerator_when_it_fits():
  from runtime import data as data_lib  # pylint: disable=g-import-not-at-top
  from runtime import device_data  # pylint: disable=g-import-not-at-top
  arrays = data_lib.ArraySource(x=np.zeros((1000, 256), np.float32))  # 1 MB
  gib = {'bytes_limit': 2**30}
  assert device_data.choose(
      arrays, 'tpu',
      gib) == (True,
               "auto: the data set's 1 MiB is within 25% of a device's memory")
  assert device_data.choose(arrays, 'tpu', {'bytes_limit': 2**21})[0] is False
  assert device_data.choose(arrays, 'cpu',
                            gib) == (False,
                                     "auto: a CPU's devices are host memory")
  assert device_data.choose([1, 2], 'gpu',
                            gib) == (False,
                                     'auto: a list is read from the host')
  assert device_data.choose(
      arrays, 'gpu', None)[1] == ('auto: the device does not say its memory')
