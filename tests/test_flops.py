"""What the chip does: FLOPs per step from the compiled step or the
workload, TFLOP/s per device, MFU against the device kind's peak, tokens/s,
on every step line, in metrics.jsonl and in the summary."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import linear_regression as linear_regression_config
import runtime
from runtime import flops
from runtime import training
from tests import helpers

pytestmark = pytest.mark.devices


@pytest.mark.parametrize('kind, peak', [
    ('TPU v5 lite', 197e12),
    ('TPU v5', 459e12),
    ('TPU v5p', 459e12),
    ('TPU v4', 275e12),
    ('TPU v6 lite', 918e12),
    ('TPU v3', 61.5e12),
    ('NVIDIA H100 80GB HBM3', 989e12),
    ('NVIDIA H100 PCIe', 756e12),
    ('NVIDIA H100 NVL', 835e12),
    ('NVIDIA H200', 989e12),
    ('NVIDIA H200 NVL', 835e12),
    ('NVIDIA GH200 480GB', 989e12),
    ('NVIDIA A100-SXM4-40GB', 312e12),
    ('NVIDIA A100-SXM4-80GB', 312e12),
    ('NVIDIA A100 80GB PCIe', 312e12),
    ('NVIDIA A100-PCIE-40GB', 312e12),
    ('NVIDIA L4', 121e12),
    ('NVIDIA L40', 181e12),
    ('NVIDIA L40S', 362e12),
    ('NVIDIA B200', 2250e12),
    ('Tesla V100-SXM2-16GB', 125e12),
    ('NVIDIA A10', 125e12),
    ('NVIDIA A10G', None),
    ('NVIDIA RTX 4090', None),
    ('cpu', None),
    ('TPU v99', None),
])
def test_the_peak_of_each_device_kind(kind, peak):
  assert flops.peak_flops(kind) == peak


def test_a_measured_ceiling_and_fp8_are_said():
  assert flops.peak_of('NVIDIA H200') == flops.Peak(
      989e12, 'NVIDIA H200 SXM, dense bf16')
  assert flops.peak_of('NVIDIA H100 80GB HBM3', fp8=True).flops == 1979e12
  assert flops.peak_of('NVIDIA H200', measured_tflops=790.0) == flops.Peak(
      790e12, 'config.peak_tflops')
  figures = flops.Figures('NVIDIA L40S', 1, lambda: 1e12, peak_tflops=300.0)
  assert figures.rates(steps_per_sec=3.0)['mfu'] == pytest.approx(0.01)
  assert ('MFU against a peak of 300 TFLOP/s per device (config.peak_tflops)'
          in figures.describe())


def test_the_compiled_step_counts_each_device_s_matmuls():
  n = jax.local_device_count()
  assert n == 8
  step = jax.pmap(lambda w, x: jax.lax.pmean((x @ w).sum(), 'i'), axis_name='i')
  w, x = jnp.ones((n, 256, 128)), jnp.ones((n, 32, 256))
  counted = flops.compiled_flops(step, w, x)
  matmul = 2 * 32 * 256 * 128  # One device's part of the batch.
  assert matmul <= counted < 1.05 * matmul, counted
  measured = flops.Measured(step)
  assert measured.flops_per_device is None
  np.testing.assert_allclose(measured(w, x), 32 * 128 * 256)
  assert measured.flops_per_device == counted


def test_rates_give_tflops_mfu_and_tokens():
  figures = flops.Figures('TPU v5 lite',
                          4,
                          lambda: 2e12,
                          global_batch_size=16,
                          tokens_per_example=512)
  rates = figures.rates(steps_per_sec=10.0)
  assert rates['tflops_per_device'] == pytest.approx(20.0)
  assert rates['mfu'] == pytest.approx(20e12 / 197e12)
  assert rates['tokens_per_sec'] == pytest.approx(512 * 16 * 10)
  assert 'a peak of 197 TFLOP/s per device (TPU v5 lite' in figures.describe()
  # The workload's own figure wins: per example, over the whole job.
  own = flops.Figures('TPU v5 lite',
                      4,
                      lambda: 2e12,
                      global_batch_size=16,
                      workload_flops_per_example=1e12)
  assert own.step_flops() == 4e12
  assert "the workload's flops_per_example" in own.describe()
  cpu = flops.Figures('cpu', 8, lambda: None, global_batch_size=16)
  assert cpu.rates(10.0) == {}
  assert "the peak of 'cpu' is unknown, so no MFU" in cpu.describe()
  assert 'FLOPs per step unknown' in cpu.describe()


def _sequence_task(config):
  """A task whose examples are sequences of 8 tokens, with its own FLOPs."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 16, size=(512, 8)).astype(np.int32)

  def loss_fn(params, batch):
    logits = params['embed'][batch['tokens']] @ params['out']
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, batch['tokens']).mean(), {}

  params = {
      'embed': np.ones((16, 4), np.float32) * 0.1,
      'out': np.ones((4, 16), np.float32) * 0.1
  }
  return runtime.Task(params=params,
                      loss_fn=loss_fn,
                      optimizer=optax.sgd(0.1),
                      data=runtime.ArraySource(tokens=tokens),
                      tokens_per_example=8,
                      flops_per_example=6 * 128 * 8)


def test_every_step_line_says_what_the_chip_does(tmp_path, caplog):
  config = linear_regression_config.get_config()
  config.steps, config.log_every = 6, 2
  task = _sequence_task(config)
  with caplog.at_level('INFO'):
    result = training.train(config, str(tmp_path), task)
  rows = [
      r for r in helpers.read_jsonl(tmp_path / 'metrics.jsonl')
      if 'steps_per_sec' in r
  ]
  assert rows
  for row in rows:
    assert row['tokens_per_sec'] == pytest.approx(8 * config.global_batch_size *
                                                  row['steps_per_sec'])
    per_device = 6 * 128 * 8 * config.global_batch_size / 8
    assert row['tflops_per_device'] == pytest.approx(
        per_device * row['steps_per_sec'] / 1e12)
    assert 'mfu' not in row  # The CPU's peak is not known.
  assert "the peak of 'cpu' is unknown, so no MFU" in caplog.text
  assert 'tokens_per_sec=' in caplog.text
  chip = result.summary()['chip']
  assert chip['device_kind'] == 'cpu' and chip['peak_tflops_per_device'] is None
  assert chip['flops_source'] == "the workload's flops_per_example"
  assert chip['tokens_per_sec'] > 0


def test_without_the_workload_s_figure_the_compiled_step_counts(tmp_path):
  config = linear_regression_config.get_config()
  config.steps, config.log_every = 4, 2
  from runtime.workloads import linear_regression  # pylint: disable=g-import-not-at-top
  task, _ = linear_regression.make_task(config)
  result = training.train(config, str(tmp_path), task)
  chip = result.summary()['chip']
  assert chip['flops_source'] == "XLA's cost analysis of the compiled step"
  # 32 examples of 3 features per device: at least the forward's and the
  # gradient's products.
  assert chip['flops_per_step_per_device'] >= 2 * 2 * 32 * 3
  assert chip['tflops_per_device'] > 0
