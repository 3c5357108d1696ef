"""Trees that must keep their structure: named at trace time, before a step."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from runtime.common import exit_codes
from runtime import parallelism
from runtime import step as step_lib
from runtime import structure

pytestmark = pytest.mark.devices


def test_differences_name_each_path():
  old = {'batch_stats': {'mean': np.zeros(3, np.float32)}}
  new = {
      'batch_stats': {
          'mean': np.zeros(3, np.float32)
      },
      'params': {
          'w': np.zeros(2, np.float32)
      }
  }
  assert structure.differences(
      old, new) == ["['params']['w']: (absent) -> float32[2]"]
  assert structure.differences(
      new, old) == ["['params']['w']: float32[2] -> (missing)"]
  assert structure.differences(
      old, {'batch_stats': {
          'mean': np.zeros(3, np.float16)
      }}) == ["['batch_stats']['mean']: float32[3] -> float16[3]"]
  assert structure.differences(
      old, {'batch_stats': {
          'mean': np.zeros(3, np.float16)
      }}, dtypes=False) == []


def test_a_step_whose_model_state_changes_structure_is_refused_naming_it():
  # The linen mistake: the whole `updates` dict instead of its batch_stats.
  def loss_fn(params, model_state, batch):
    loss = jnp.mean((batch['x'] * params['w'])**2)
    return loss, ({}, {'batch_stats': model_state, 'extra': jnp.zeros(2)})

  par = parallelism.PMAP
  step = step_lib.make_train_step(loss_fn,
                                  optax.sgd(0.1),
                                  par,
                                  has_model_state=True)
  state = step_lib.init_state({'w': np.ones(3, np.float32)},
                              optax.sgd(0.1),
                              model_state={'mean': np.zeros(3, np.float32)})
  batch = {'x': np.ones((8 * jax.local_device_count(), 3), np.float32)}
  with pytest.raises(structure.StructureError) as e:
    step(par.replicate(state), par.put_batch(batch))
  message = str(e.value)
  assert 'model_state changed its structure in the step' in message
  assert "['batch_stats']['mean']: (absent) -> float32[3]" in message
  assert "['mean']: float32[3] -> (missing)" in message
  assert 'updates["batch_stats"]' in message


def test_a_late_recompilation_warns_once_naming_the_argument(caplog):
  fn = structure.RecompileWatch(jax.jit(lambda x, y: x * 2 + y.sum()),
                                name='the test step')
  x, y = np.ones(4, np.float32), np.ones(3, np.float32)
  for _ in range(3):
    fn(x, y)
  assert not fn.warned
  with caplog.at_level('WARNING'):
    fn(x, np.ones(5, np.float32))  # A new shape: a new compilation.
    fn(x, np.ones(6, np.float32))
  assert fn.warned
  warnings = [
      r.getMessage()
      for r in caplog.records
      if 'compiled again' in r.getMessage()
  ]
  assert len(warnings) == 1, warnings
  assert 'the test step compiled again at call 4' in warnings[0]
  assert '[1]: float32[3]' in warnings[0] and '-> float32[5]' in warnings[0]


def test_a_loss_fn_of_the_wrong_arity_names_the_signatures():

  def loss_fn(params, batch, rng):  # Takes an rng the task does not ask for.
    del rng
    return jnp.mean(batch['x'] * params['w']), {}

  with pytest.raises(exit_codes.ConfigError) as e:
    step_lib.make_train_step(loss_fn, optax.sgd(0.1), parallelism.PMAP)
  message = str(e.value)
  assert 'loss_fn(params, batch, rng) takes 3 positional argument(s), but ' \
         'the step calls it with 2 (model state: no, rng: no' in message
  assert 'loss_fn(params, model_state, batch) -> (loss, (metrics, ' \
         'new_model_state))' in message
  # With the rng asked for, it is accepted.
  step_lib.make_train_step(loss_fn,
                           optax.sgd(0.1),
                           parallelism.PMAP,
                           rng='device')


def test_the_recompile_watch_keeps_no_argument_alive():
  watched = structure.RecompileWatch(jax.jit(lambda x: x * 2))
  x = np.ones(5, np.float32)
  alive = weakref.ref(x)
  watched(x)
  del x
  gc.collect()
  assert alive() is None  # Only its signature stays, for the warning.


def test_the_recompile_warning_describes_the_previous_call_from_its_signature():
  watched = structure.RecompileWatch(jax.jit(lambda x, y: x * y))
  for x in (np.ones(3), np.ones(3), np.ones(3)):
    watched(x, 2.0)
  message = watched._message((np.ones(5, np.float32), 2.0))  # pylint: disable=protected-access
  assert '[0]: float64[3] -> float32[5]' in message, message
  assert '[1]' not in message  # The Python float did not change.
