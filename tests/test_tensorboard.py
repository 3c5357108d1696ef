"""TensorBoard event files, read back with TensorBoard's own reader."""

import pytest
from tensorboard.backend.event_processing import event_accumulator

from configs import linear_regression as linear_regression_config
from runtime import metrics
from runtime import tensorboard
from runtime import training
from runtime.common import layout
from runtime.workloads import linear_regression
from tests import helpers

pytestmark = pytest.mark.devices


def _scalars(logdir) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} as TensorBoard loads them."""
  reader = event_accumulator.EventAccumulator(
      str(logdir), size_guidance={event_accumulator.SCALARS: 0})
  reader.Reload()
  return {
      tag: [(e.step, e.value) for e in reader.Scalars(tag)]
      for tag in reader.Tags()['scalars']
  }


def _train(workdir, steps):
  config = linear_regression_config.get_config()
  config.steps, config.log_every, config.checkpoint_every = steps, 4, 4
  task, _ = linear_regression.make_task(config)
  return training.train(config, str(workdir), task)


def test_every_metric_of_metrics_jsonl_is_in_tensorboard(tmp_path):
  _train(tmp_path, 12)
  scalars = _scalars(tmp_path / layout.TENSORBOARD)
  records = helpers.read_jsonl(tmp_path / 'metrics.jsonl')
  assert [r['step'] for r in records] == [4, 8, 12]
  for record in records:
    for name, value in record.items():
      if name != 'step':  # float32 in the event file.
        assert dict(scalars[name])[record['step']] == pytest.approx(
            value, rel=1e-6), name


def test_a_resumed_run_shows_each_step_once(tmp_path):
  _train(tmp_path, 8)
  # As if killed after logging step 12 with its last checkpoint at 8.
  writer = metrics.MetricsWriter(layout.Record(str(tmp_path)),
                                 True,
                                 resume_step=8)
  writer.write(12, {'loss': 99.0})
  writer.close()
  _train(tmp_path, 16)
  steps = [s for s, _ in _scalars(tmp_path / layout.TENSORBOARD)['loss']]
  assert steps == [4, 8, 12, 16]
  loss_at_12 = dict(_scalars(tmp_path / layout.TENSORBOARD)['loss'])[12]
  assert loss_at_12 != 99.0


def test_non_numbers_are_left_out(tmp_path):
  writer = tensorboard.EventWriter(layout.Record(str(tmp_path)))
  writer.scalars(1, {
      'loss': 0.5,
      'name': 'x',
      'flag': True,
      'inf': float('inf')
  })
  writer.close()
  assert _scalars(tmp_path / layout.TENSORBOARD) == {'loss': [(1, 0.5)]}
