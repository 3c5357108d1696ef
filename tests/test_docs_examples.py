"""Every Python example of the README and the docs runs.

An example is a whole file of a user's project (its first line
`# my_project/NAME.py`): the files are written into one directory, as a
user would, and each workload trains a few steps here, in this process, on
the 8 emulated devices (tests/test_cli.py runs the README's two files with
`podrun` from their directory). A file shown on two pages is the same file
on both. The one example that is not a file, `raise runtime.PodrunError`,
is run and must raise. Any other block fails the test, naming its page.
"""

import json
import pathlib
import re
import sys

import numpy as np
import pytest

import runtime
from tests import helpers

pytestmark = pytest.mark.devices

PAGES = [
    helpers.REPO / 'README.md', *sorted((helpers.REPO / 'docs').rglob('*.md'))
]
_FILE = re.compile(r'# my_project/(\w+)\.py')
# Blocks that are not files, and what runs them here.
_RAISES = "raise runtime.PodrunError('the input bucket is unreachable', exit_code=42)"


def _python_blocks() -> list[tuple[pathlib.Path, str]]:
  return [(page, body)
          for page in PAGES
          for body in re.findall(r'```python\n(.*?)```', page.read_text(), re.S)
         ]


def project_files() -> dict[str, str]:
  """{module name: source} of every file example; others are checked."""
  files, others = {}, []
  for page, body in _python_blocks():
    found = _FILE.match(body)
    if found is None:
      if _RAISES not in body:
        others.append(f'{page.relative_to(helpers.REPO)}: {body[:60]!r}')
      continue
    name = found.group(1)
    assert files.setdefault(
        name,
        body) == body, (f'{name}.py differs between the pages that show it; '
                        f'{page.relative_to(helpers.REPO)} has another')
    files[name] = body
  assert not others, ('Python blocks that are neither a file of '
                      '`# my_project/NAME.py` nor run here: ' +
                      '; '.join(others))
  return files


@pytest.fixture(scope='module')
def project(tmp_path_factory):
  """The examples' files in one directory, importable as a user's are."""
  root = tmp_path_factory.mktemp('my_project')
  files = project_files()
  for name, body in files.items():
    (root / f'{name}.py').write_text(body)
  sys.path.insert(0, str(root))
  yield files
  sys.path.remove(str(root))
  for name in files:
    sys.modules.pop(name, None)


def _train(name: str, workdir, steps: int = 30):
  """The workload of example `name`, with its own config, `steps` steps."""
  import importlib  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(name)
  config_module = importlib.import_module(
      f'{name}_config' if not hasattr(module, 'get_config') else name)
  config = config_module.get_config()
  assert config.workload == f'{name}:train_and_evaluate'
  config.steps = steps
  return module.train_and_evaluate(config, str(workdir))


def test_every_example_is_a_file_or_runs_here(project):
  assert {
      'my_regression', 'my_regression_config', 'my_evaluation', 'my_hooks',
      'my_dropout', 'my_linen', 'my_loop', 'my_imagenet', 'my_lm1b'
  } <= set(project)


def test_the_regression_learns_its_weights(project, tmp_path):
  result = _train('my_regression', tmp_path)
  assert result.final_metrics['loss'] < 0.1


def test_the_evaluation_scores_the_test_set(project, tmp_path):
  result = _train('my_evaluation', tmp_path, steps=50)
  assert result.eval_metrics['eval_num_examples'] == 1000
  assert result.eval_metrics['eval_squared_error'] < 0.01


def test_the_hook_writes_its_metric_every_10_steps(project, tmp_path):
  _train('my_hooks', tmp_path)
  lines = [
      json.loads(l)
      for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()
  ]
  assert [l['step'] for l in lines if 'weight_norm' in l] == [10, 20, 30]


def test_the_nnx_model_trains_with_a_key_per_example(project, tmp_path):
  first = _train('my_dropout', tmp_path / 'a', steps=1)
  last = _train('my_dropout', tmp_path / 'b', steps=30)
  assert last.final_metrics['loss'] < first.final_metrics['loss']


def test_the_linen_model_trains_with_a_key_per_call(project, tmp_path):
  first = _train('my_linen', tmp_path / 'a', steps=1)
  last = _train('my_linen', tmp_path / 'b', steps=30)
  assert last.final_metrics['loss'] < first.final_metrics['loss']


def test_flax_s_imagenet_habits_train_as_the_docs_say(project, tmp_path):
  # The workload sets config.steps from num_epochs: 3 epochs of 16 steps.
  result = _train('my_imagenet', tmp_path)
  assert result.steps == 48
  rows = [
      json.loads(l)
      for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()
  ]
  assert rows[-1]['cross_entropy'] < rows[0]['cross_entropy']
  assert {'loss_scale', 'loss_scale_skipped', 'learning_rate'} <= set(rows[0])
  assert result.model_state['batch_stats']


def test_a_loop_of_its_own_learns_the_weights(project, tmp_path):
  result = _train('my_loop', tmp_path)
  np.testing.assert_allclose(result['w'], [1., -2., 3.], atol=0.05)


def test_the_exit_code_example_raises_its_code():
  with pytest.raises(runtime.PodrunError) as e:
    exec(_RAISES, {'runtime': runtime})  # pylint: disable=exec-used
  assert e.value.exit_code == 42


def test_lm1b_s_weighted_loss_schedule_and_evaluation(project, tmp_path):
  result = _train('my_lm1b', tmp_path, steps=30)
  rows = [
      json.loads(l)
      for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()
      if '"loss"' in l
  ]
  assert rows[-1]['loss'] < rows[0]['loss']
  assert 'learning_rate' in rows[0]  # rsqrt logged from count 0 on.
  assert 0 <= rows[-1]['accuracy'] <= 1
  assert result.eval_metrics['eval_num_examples'] == 200
  assert np.isfinite(result.eval_metrics['eval_loss'])
