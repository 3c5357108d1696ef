"""A user's mistakes, made in a project outside the checkout, each refused
with exit 2 before step 1 and a line naming the fix: Flax's (loss, logits),
a per-example metric, a generator as Task.data, Flax's config names, and an
evaluation metric that is a mean rather than per example."""

import pytest

from runtime.common import exit_codes
from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]

_WORKLOAD = '''"""A regression whose loss_fn or data go wrong as config.mistake says."""

import numpy as np
import optax
import runtime


def train_and_evaluate(config, workdir):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(256, 3)).astype(np.float32)
  y = x @ np.array([1., -2., 3.], np.float32)

  def loss_fn(params, batch):
    prediction = batch['x'] @ params['w']
    loss = ((prediction - batch['y']) ** 2).mean()
    if config.mistake == 'logits':
      return loss, prediction
    if config.mistake == 'per_example':
      return loss, {'error': prediction - batch['y']}
    return loss, {}

  def metric_fn(params, batch):
    error = (batch['x'] @ params['w'] - batch['y']) ** 2
    return {'error': error.mean() if config.mistake == 'mean_metric'
            else error}

  data = runtime.ArraySource(x=x, y=y)
  eval_fn = lambda params, _: runtime.evaluate(
      params, metric_fn, data, 64, runtime.parallelism.from_config(config))
  if config.mistake == 'generator':
    data = ({'x': a, 'y': b} for a, b in zip(x, y))
  learning_rate = 0.1 if config.mistake == 'flax_names' else (
      config.optimizer.learning_rate)
  return runtime.train(config, workdir, runtime.Task(
      params={'w': np.zeros(3, np.float32)}, loss_fn=loss_fn,
      optimizer=optax.sgd(learning_rate), data=data, eval_fn=eval_fn))
'''

_CONFIG = '''from runtime import config_base


def get_config(mistake='none'):
  config = config_base.get_config()
  config.workload = 'my_workload:train_and_evaluate'
  config.mistake = mistake
  config.steps = 5
  config.global_batch_size = 32
  if mistake == 'flax_names':  # Flax's default.py
    config.batch_size = 128
    config.num_epochs = 10
    config.learning_rate = 0.1
  return config
'''


@pytest.fixture(scope='module')
def project(tmp_path_factory):
  root = tmp_path_factory.mktemp('my_project')
  (root / 'my_workload.py').write_text(_WORKLOAD)
  (root / 'my_config.py').write_text(_CONFIG)
  return root


@pytest.mark.parametrize('mistake, fix', [
    ('none', None),
    ('logits', 'compute the metrics from the logits inside loss_fn'),
    ('per_example', "loss_fn's metric 'error' has shape (4,); metrics must "
     'be scalars'),
    ('generator', 'Load the arrays into runtime.ArraySource(**arrays)'),
    ('flax_names', 'batch_size=128, which podrun does not read: set '
     'config.global_batch_size'),
    ('mean_metric', "metric_fn's 'error' has shape (); it must hold one value "
     'per example'),
])
def test_each_mistake_ends_before_step_1_naming_the_fix(project, tmp_path,
                                                        mistake, fix):
  result = helpers.run_launcher(
      [f'--config=my_config.py:{mistake}', f'--workdir={tmp_path}/job'],
      cwd=project)
  if fix is None:
    assert result.returncode == 0, result.output[-3000:]
    assert 'eval at step 5: eval_error=' in result.stderr
    return
  assert result.returncode == exit_codes.CONFIG_ERROR, result.output[-3000:]
  assert fix in result.stderr, result.stderr[-3000:]
  metrics = tmp_path / 'job' / 'metrics.jsonl'
  assert not metrics.exists() or not metrics.read_text()
