"""The two rng contracts (runtime/randomness.py) with Flax's own dropout
layers: one key per call trains and says once that its dropout depends on
the layout; a key per example, through runtime.per_example, gives the same
step in any microbatches; a loss that fails on the key it got is named
before step 1 with the contract, the shape and the other choice."""

import dataclasses
import logging

from flax import linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import runtime
from runtime import training
from runtime.common import exit_codes
from tests import helpers
from tests.workloads import charlm
from tests.workloads import charlm_config

pytestmark = pytest.mark.devices


def _config(rng: str, **fields):
  config = charlm_config.get_config()
  config.rng = rng
  config.steps = 6
  config.checkpointing = False
  config.update(fields)
  return config


def _train(config, workdir, task=None):
  return training.train(config, str(workdir), task or charlm.make_task(config))


def _assert_close(one, two, rtol=1e-5, atol=1e-6):
  """Leaf by leaf (Flax's State has paths of its own kind)."""
  left, right = jax.tree_util.tree_leaves(one), jax.tree_util.tree_leaves(two)
  assert len(left) == len(right)
  for a, b in zip(left, right):
    np.testing.assert_allclose(np.asarray(a),
                               np.asarray(b),
                               rtol=rtol,
                               atol=atol)


def test_one_key_a_call_trains_flax_dropout_and_says_it_once(tmp_path, caplog):
  caplog.set_level(logging.WARNING)
  config = _config('')  # The model's code of before: loss_uses_rng=True.
  one = _train(config, tmp_path / 'k1')
  said = [
      r.getMessage()
      for r in caplog.records
      if 'one key per call' in r.getMessage()
  ]
  assert len(said) == 1, said
  assert 'Task(loss_uses_rng=True)' in said[0]
  assert "Task(rng='example')" in said[0]
  # As it says: two microbatches draw other masks, another step.
  config.microbatches = 2
  two = _train(config, tmp_path / 'k2')
  assert one.fingerprint != two.fingerprint


def test_flax_dropout_per_example_is_the_same_in_any_microbatches(tmp_path):
  """About 15-35 s: four runs of the transformer, each compiling a step of
  its own layout (the tests beside it run in parallel workers)."""
  config = _config('example')
  results = {}
  for name, fields in (('1', {}), ('2', {
      'microbatches': 2
  }), ('size 2', {
      'microbatch_size': 2
  })):
    results[name] = _train(_config('example', **fields), tmp_path / name)
  assert results['size 2'].topology['microbatches'] == 3
  for name in ('2', 'size 2'):
    _assert_close(results[name].params, results['1'].params)
  # The masks matter: without dropout the parameters differ.
  config.model.dropout = 0.0
  plain = _train(config, tmp_path / 'no_dropout')
  assert plain.fingerprint != results['1'].fingerprint


class _LinenMLP(linen.Module):

  @linen.compact
  def __call__(self, x):
    x = linen.relu(linen.Dense(16)(x))
    return linen.Dense(1)(linen.Dropout(0.5, deterministic=False)(x))


def test_linen_dropout_per_example_is_the_same_in_any_microbatches(tmp_path):
  model = _LinenMLP()
  x = jax.random.normal(jax.random.key(0), (96, 4))
  y = x.sum(-1, keepdims=True)
  params = model.init(jax.random.key(1), x[:1])

  def loss_fn(params, batch, rng):
    out = runtime.per_example(
        lambda key, xs: model.apply(params, xs, rngs={'dropout': key}))(
            rng, batch['x'])
    return jnp.mean((out - batch['y'])**2), {}

  task = runtime.Task(params=jax.device_get(params),
                      loss_fn=loss_fn,
                      optimizer=runtime_sgd(),
                      rng='example',
                      data=runtime.ArraySource(x=x, y=y))
  results = [
      _train(_config('', global_batch_size=32, microbatches=k),
             tmp_path / str(k), task) for k in (1, 2)
  ]
  _assert_close(results[1].params, results[0].params)


def runtime_sgd():
  import optax  # pylint: disable=g-import-not-at-top
  return optax.sgd(0.1)


def _nnx_loss_with_a_bare_key(rng_contract: str):
  """A loss whose layers take the key as it comes: Flax's nnx.Rngs under
  'example', runtime.dropout under 'device' (each the other's)."""
  config = _config('')
  task = charlm.make_task(config)
  graphdef_loss = task.loss_fn

  def loss_fn(params, batch, rng):
    if rng_contract == 'device':
      batch = {
          **batch, 'x':
              batch['x'] * runtime.dropout(rng, 0.0, jnp.ones(
                  batch['x'].shape)).astype(batch['x'].dtype)
      }
    return graphdef_loss(params, batch, rng)

  return dataclasses.replace(task,
                             loss_fn=loss_fn,
                             loss_uses_rng=False,
                             rng=rng_contract)


@pytest.mark.parametrize('contract,shape,other', [
    ('example', '(6, 2)', "Task(rng='device')"),
    ('device', '(2,)', "choose Task(rng='example')"),
])
def test_a_key_of_the_other_contract_is_named_before_step_1(
    tmp_path, contract, shape, other):
  config = _config('')
  task = _nnx_loss_with_a_bare_key(contract)
  with pytest.raises(exit_codes.ConfigError) as raised:
    _train(config, tmp_path, task)
  message = str(raised.value)
  assert f'loss_fn failed on its rng, uint32 {shape}' in message, message
  assert f"The task chose rng='{contract}'" in message, message
  assert other in message, message
  assert not [
      r for r in helpers.read_jsonl(tmp_path / 'metrics.jsonl') if 'loss' in r
  ]  # No step ran.


def test_an_unknown_contract_is_refused_at_once():
  with pytest.raises(exit_codes.ConfigError, match="Task\\(rng='batch'\\)"):
    runtime.Task(params={},
                 loss_fn=lambda p, b, r: (0.0, {}),
                 optimizer=runtime_sgd(),
                 data=[],
                 rng='batch')


def test_per_example_runs_a_batch_of_one_per_key():
  seen = []

  def forward(key, x):
    seen.append(x.shape)
    return x * jax.random.uniform(key, x.shape)

  keys = jax.vmap(
      lambda i: jax.random.fold_in(jax.random.key_data(jax.random.key(0)), i))(
          jnp.arange(5, dtype=jnp.uint32))
  x = jnp.ones((5, 3))
  out = runtime.per_example(forward)(keys, x)
  assert out.shape == (5, 3) and seen == [(1, 3)]
  # Row i depends on key i alone: the last three rows, computed apart.
  tail = runtime.per_example(forward)(keys[2:], x[2:])
  assert jnp.allclose(out[2:], tail)
