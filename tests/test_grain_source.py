"""A grain MapDataset (its map and random_map) as a task's data: read by
podrun's own order of global ids, so that every layout and a resume read
exactly the records, and the random draws, an undisturbed run reads."""

import numpy as np
import pytest

from tests.workloads import census
from tests.workloads import probe
from tests.workloads import probe_config

grain = pytest.importorskip('grain')

pytestmark = pytest.mark.devices


def _train(workdir, **fields):
  config = probe_config.get_config()
  config.census, config.steps, config.log_every = True, 12, 4
  config.data.grain = True
  for name, value in fields.items():
    config[name] = value
  return config, probe.train_and_evaluate(config, str(workdir))


def test_a_grain_pipeline_trains_alike_on_any_layout(tmp_path):
  config, one_pass = _train(tmp_path / 'one', checkpoint_every=0)
  _, grouped = _train(tmp_path / 'grouped', checkpoint_every=0, microbatches=4)
  _, padded = _train(tmp_path / 'padded',
                     checkpoint_every=0,
                     global_batch_size=100)
  counts = census.counts(one_pass.params)
  np.testing.assert_array_equal(
      counts.examples,
      census.expected(config.global_batch_size, config.data.num_examples,
                      config.seed, 12))
  np.testing.assert_allclose(grouped.params['weight'],
                             one_pass.params['weight'],
                             rtol=2e-5)
  assert census.counts(padded.params).steps == 12
  # The jitter is the pipeline's: without it the run differs.
  config.data.grain = False
  plain = probe.train_and_evaluate(config, str(tmp_path / 'plain'))
  assert plain.fingerprint != one_pass.fingerprint


def test_a_resumed_grain_run_equals_an_undisturbed_one(tmp_path):
  _, straight = _train(tmp_path / 'straight', checkpoint_every=6)
  _train(tmp_path / 'resumed', checkpoint_every=6, steps=6)
  _, resumed = _train(tmp_path / 'resumed', checkpoint_every=6)
  assert resumed.start_step == 6
  assert resumed.fingerprint == straight.fingerprint


def test_random_map_draws_by_record_not_by_reader():
  # What makes the above hold: a record's draw depends on the seed and its
  # index, whichever process or step reads it, in any order.
  from runtime import data  # pylint: disable=g-import-not-at-top
  pipeline = probe._grain_pipeline(  # pylint: disable=protected-access
      data.ArraySource(x=np.zeros((10, 3), np.float32),
                       y=np.zeros(10, np.float32)),
      seed=3)
  forward = data.read_batch(pipeline, np.arange(10))['x']
  backward = data.read_batch(pipeline, np.arange(10)[::-1])['x'][::-1]
  np.testing.assert_array_equal(forward, backward)
  assert np.abs(forward).max() > 0
