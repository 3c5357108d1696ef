"""The census (tests/workloads/census.py) counts what a run trained, exactly."""

import numpy as np
import pytest

from tests.workloads import census
from tests.workloads import probe
from tests.workloads import probe_config

pytestmark = pytest.mark.devices


def _train(tmp_path, **fields):
  config = probe_config.get_config()
  config.census = True
  config.steps = 12
  config.log_every = 4
  config.checkpoint_every = 0
  for name, value in fields.items():
    config[name] = value
  result = probe.train_and_evaluate(config, str(tmp_path))
  return config, census.counts(result.params)


@pytest.mark.parametrize(
    'fields',
    [
        {},  # 256 on 8 devices: one pass.
        {
            'microbatches': 4
        },  # 4 groups of 8 a device.
        {
            'global_batch_size': 100
        },  # groups of 20, 3 padding.
        {
            'global_batch_size': 100,
            'device_batch_limit': 4
        }
    ])
def test_every_example_and_step_trained_is_counted_once(tmp_path, fields):
  config, counts = _train(tmp_path, **fields)
  assert counts.steps == 12
  want = census.expected(config.global_batch_size, config.data.num_examples,
                         config.seed, 12)
  assert want.sum() == 12 * config.global_batch_size
  np.testing.assert_array_equal(counts.examples, want)


def test_the_census_tells_a_repeated_or_skipped_step():
  # What the elastic tests rely on: the counts of 60 steps differ from
  # those of 60 steps with one repeated or one skipped, in integers.
  straight = census.expected(40, 4096, 0, 60)
  repeated = straight + census.expected(40, 4096, 0, 31) - census.expected(
      40, 4096, 0, 30)
  skipped = straight - (census.expected(40, 4096, 0, 51) -
                        census.expected(40, 4096, 0, 50))
  assert (repeated - straight).sum() == 40 == (straight - skipped).sum()


def test_a_fraction_in_the_census_is_refused():
  params = {
      census.KEY: {
          'examples': np.array([1.0, 0.5], np.float32),
          'steps': np.float32(2.0)
      }
  }
  with pytest.raises(AssertionError, match='holds a fraction'):
    census.counts(params)
