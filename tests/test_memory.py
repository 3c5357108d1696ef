"""What the step needs of each device's memory (runtime/memory.py), and
sharded state that holds a fraction of it: the parameters gathered where a
layer uses them, on 8 devices as one replica and as two."""

import jax
import jax.numpy as jnp
import pytest

from configs import linear_regression as linear_regression_config
from runtime import memory
from runtime import training
from runtime.workloads import linear_regression
from tests.benchmarks import benchmark_fsdp

pytestmark = pytest.mark.devices


def test_the_memory_analysis_counts_arguments_outputs_and_temporaries():
  step = jax.jit(lambda w, x: (w - 0.1 * (x.T @ (x @ w)), (x @ w).sum()),
                 donate_argnums=0)
  w, x = jnp.ones((256, 256)), jnp.ones((64, 256))
  need = memory.of_compiled(step.lower(w, x).compile())
  assert need.arguments == (256 * 256 + 64 * 256) * 4
  assert need.total >= need.arguments
  assert 'the step needs' in need.describe()


def test_a_step_over_the_device_names_what_to_change():
  need = memory.StepMemory(arguments=6 * 2**30,
                           outputs=4 * 2**30,
                           aliased=4 * 2**30,
                           temporaries=12 * 2**30)
  fits, line = memory.verdict(need, 16 * 2**30)
  assert not fits
  assert '18.00 GiB' in line and 'over the device\'s 16.00 GiB by 2.00 GiB' in line
  assert "state_layout='sharded'" in line and 'device_batch_limit' in line
  fits, line = memory.verdict(need, 32 * 2**30)
  assert fits and '56%' in line


def test_a_run_says_what_its_step_needs(tmp_path, caplog):
  config = linear_regression_config.get_config()
  config.steps = 2
  task, _ = linear_regression.make_task(config)
  with caplog.at_level('INFO'):
    result = training.train(config, str(tmp_path), task)
  said = [
      r.getMessage()
      for r in caplog.records
      if r.getMessage().startswith('the step needs')
  ]
  assert len(said) == 1 and 'does not say its memory' in said[0], said
  assert result.chip['step_memory']['total'] > 0


@pytest.mark.parametrize('grid,replicas', [('1x8', 1), ('2x4', 2)])
def test_sharded_state_needs_under_a_third_of_the_replicated_bytes(
    grid, replicas):
  """About 30 s: two compilations of the decoder LM (8 layers of width
  1024, 103 M parameters, Adam, each layer recomputed in the backward pass),
  from abstract arguments. Replicated, a device holds 16 bytes a parameter
  and the activations; sharded, its share of the state, one layer whole
  and the activations."""
  del grid
  need = benchmark_fsdp.step_memory(1024, 8, replicas)
  ratio = need['sharded'].total / need['replicated'].total
  assert ratio <= 0.3, (need, ratio)
