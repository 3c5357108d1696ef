"""A loss weighted by tokens, given as runtime.Weighted(total, weight),
trains on 8 devices, with padding, microbatches and sharded state, to the
parameters one device reaches with the whole global batch; its evaluation
gives the token-weighted figure (runtime/weighted.py)."""

import jax
import numpy as np
import pytest

from runtime import batch_layout
from runtime import training
from tests.workloads import token_lm
from tests.workloads import token_lm_config

pytestmark = pytest.mark.devices

STEPS = 12


def _config(**fields):
  config = token_lm_config.get_config()
  config.steps = STEPS
  for name, value in fields.items():
    config[name] = value
  return config


def _assert_close(params, want, rtol=2e-5):
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6),
      params, want)


@pytest.mark.parametrize(
    'fields',
    [
        {},  # 1 pass of 4 a device.
        {
            'microbatches': 4
        },
        {
            'global_batch_size': 20  # Groups of 3 on 8 devices: 4 padding.
        },
        {
            'state_layout': 'sharded',
            'microbatches': 2
        },
    ],
    ids=['1x8', 'microbatches', 'padded', 'sharded'])
def test_a_token_weighted_loss_trains_as_one_device_on_any_layout(
    tmp_path, fields):
  config = _config(**fields)
  result = training.train(config, str(tmp_path),
                          token_lm.make_task(config, str(tmp_path)))
  want, eval_loss = token_lm.one_device(config, STEPS)
  _assert_close(result.params, want)
  # The held-out figure is weighted by tokens, over a padded last batch.
  assert result.eval_metrics['eval_loss'] == pytest.approx(eval_loss, rel=1e-5)


def test_a_mean_of_device_means_is_another_figure(tmp_path):
  # The reason for the weighted form: each device's own token mean,
  # averaged, moves the parameters away from one device's.
  config = _config(loss='device_mean')
  result = training.train(config, str(tmp_path), token_lm.make_task(config))
  want, _ = token_lm.one_device(config, STEPS)
  gap = max(
      float(np.abs(a - b).max())
      for a, b in zip(jax.tree_util.tree_leaves(result.params),
                      jax.tree_util.tree_leaves(want)))
  assert gap > 1e-3, gap


def test_a_loss_dividing_by_a_psum_is_refused_with_more_than_one_pass(tmp_path):
  config = _config(loss='psum', microbatches=2)
  with pytest.raises(batch_layout.PaddingError,
                     match=r'2 pass\(es\) a device.*runtime\.Weighted'):
    training.train(config, str(tmp_path), token_lm.make_task(config))
  # One pass a device: accepted, and exact.
  config = _config(loss='psum')
  result = training.train(config, str(tmp_path / 'one'),
                          token_lm.make_task(config))
  _assert_close(result.params, token_lm.one_device(config, STEPS)[0])


def test_sharded_state_binds_the_configured_axis_name(tmp_path):
  # A model's own collective over config.axis_name ('batch', Flax's name)
  # under sharded state: bound by the step, not refused.
  config = _config(loss='psum', axis_name='batch', state_layout='sharded')
  result = training.train(config, str(tmp_path), token_lm.make_task(config))
  _assert_close(result.params, token_lm.one_device(config, STEPS)[0])


def test_evaluation_under_sharded_state_says_what_it_costs(tmp_path, caplog):
  config = _config(state_layout='sharded', steps=1)
  with caplog.at_level('INFO'):
    training.train(config, str(tmp_path), token_lm.make_task(config))
  whole = (32 * 16 + 16 * 32) * 4 / 2**20  # embed and out, float32.
  assert (f'evaluation: eval_fn gets the parameters whole on every device '
          f'while it runs, {whole:.1f} MiB a device') in caplog.text
