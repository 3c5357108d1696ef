"""`import runtime`: the names a workload needs, loaded on first use, and the
old spellings that still work for one release, with a warning."""

import ast
import subprocess
import sys
import warnings

import numpy as np
import optax
import pytest

from configs import linear_regression
import runtime
from runtime import hooks
from tests import helpers

pytestmark = pytest.mark.unit


def test_every_public_name_resolves():
  for name in runtime.__all__:
    assert getattr(runtime, name) is not None, name
  assert set(runtime.__all__) <= set(dir(runtime))


def _fresh_python(code: str) -> subprocess.CompletedProcess:
  """`code` in a new interpreter, from the repository's root."""
  return subprocess.run([sys.executable, '-c', code],
                        cwd=helpers.REPO,
                        capture_output=True,
                        text=True,
                        timeout=60,
                        check=False)


def test_importing_runtime_loads_no_jax():
  result = _fresh_python(
      'import sys, runtime, runtime.common.goodput\n'
      'print(any(m == "jax" or m.startswith("jax.") for m in sys.modules))')
  assert result.stdout.strip() == 'False', result.stderr


def _task(**fields):
  return runtime.Task(params={'w': np.zeros(3, np.float32)},
                      loss_fn=lambda params, batch: (0.0, {}),
                      optimizer=optax.sgd(0.1),
                      data=runtime.ArraySource(x=np.zeros((8, 3))),
                      **fields)


def test_the_old_module_spellings_warn_and_work():
  with pytest.warns(DeprecationWarning, match='runtime.Task'):
    from runtime import train  # pylint: disable=g-import-not-at-top
    assert train.Task is runtime.Task
  with pytest.warns(DeprecationWarning, match='runtime.train.train'):
    assert train.train is runtime.train.__wrapped__
  with pytest.warns(DeprecationWarning, match='runtime.evaluate.evaluate'):
    assert runtime.evaluate.evaluate is runtime.evaluate.__wrapped__
  config = linear_regression.get_config()
  with pytest.warns(DeprecationWarning, match='from_config'):
    assert runtime.parallelism.of(config) is (
        runtime.parallelism.from_config(config))


def test_task_evaluate_is_the_old_name_of_eval_fn():

  def score(params, model_state):
    return {}

  with pytest.warns(DeprecationWarning, match='eval_fn'):
    task = _task(evaluate=score)
  assert task.eval_fn is score and task.evaluate is None
  with pytest.raises(ValueError, match='both eval_fn and evaluate'):
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', DeprecationWarning)
      _task(eval_fn=score, evaluate=score)


def test_a_hook_written_for_periodic_run_still_runs_with_a_warning():
  seen = []

  class Old(hooks.Periodic):

    def run(self, run):
      seen.append(run)

  class New(hooks.Periodic):

    def work(self, run):
      seen.append(('new', run))

  with pytest.warns(DeprecationWarning, match='override work'):
    Old(1).work('a run')
  with warnings.catch_warnings():
    warnings.simplefilter('error', DeprecationWarning)
    New(1).work('b run')
    hooks.Periodic(1, seen.append).work('c run')
  assert seen == ['a run', ('new', 'b run'), 'c run']


def test_launcher_exit_codes_is_the_old_name():
  result = _fresh_python('import warnings\nwarnings.simplefilter("error")\n'
                         'import launcher.exit_codes')
  assert 'runtime.common.exit_codes' in result.stderr
  from runtime.common import exit_codes  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    import launcher.exit_codes as old  # pylint: disable=g-import-not-at-top
  assert old.PodrunError is exit_codes.PodrunError is runtime.PodrunError
  assert old.PREEMPTED == 75


def test_process_slice_is_the_old_name_of_process_rows():
  with pytest.warns(DeprecationWarning, match='process_rows'):
    old = runtime.parallelism.process_slice(256, 1, 2)
  assert old == runtime.parallelism.process_rows(256, 1, 2) == slice(128, 256)


def test_host_state_is_the_old_name_of_numpy_state():
  from runtime import loop  # pylint: disable=g-import-not-at-top
  run = loop.Run.__new__(loop.Run)  # Only the method is under test.
  run.numpy_state = lambda: 'the state'
  with pytest.warns(DeprecationWarning, match='numpy_state'):
    assert run.host_state() == 'the state'


def test_preempted_and_checkpoint_error_are_at_the_front_door():
  from runtime.checkpoints import checkpoint_meta  # pylint: disable=g-import-not-at-top
  from runtime import preemption  # pylint: disable=g-import-not-at-top
  assert runtime.Preempted is preemption.Preempted
  assert runtime.CheckpointError is checkpoint_meta.CheckpointError
  assert issubclass(runtime.Preempted, runtime.PodrunError)


def _project_sources():
  for top in ('runtime', 'launcher', 'configs'):
    yield from sorted((helpers.REPO / top).rglob('*.py'))


def test_every_old_spelling_is_in_the_one_table():
  """A DeprecationWarning comes from deprecations.warn alone, and every key
  of its table is still used by a shim (one that went takes its row)."""
  from runtime.common import deprecations  # pylint: disable=g-import-not-at-top
  used = set()
  for path in _project_sources():
    if path.name == 'deprecations.py':
      continue
    text = path.read_text()
    tree = ast.parse(text)
    for node in ast.walk(tree):
      if (isinstance(node, ast.Call) and
          isinstance(node.func, ast.Attribute) and node.func.attr == 'warn'):
        owner = ast.unparse(node.func.value)
        assert owner != 'warnings' or 'DeprecationWarning' not in (
            ast.unparse(node)), f'{path}: {ast.unparse(node)}'
        if owner == 'deprecations':
          key = node.args[0].value
          assert key in deprecations.RENAMED, f'{path}: {key}'
          used.add(key)
  assert used == set(deprecations.RENAMED)


def test_the_built_in_workloads_import_the_runtime_by_its_front_door():
  """`import runtime`, `from runtime import NAME` for NAME in __all__, or a
  sibling of runtime/workloads/, as a user's workload would."""
  for path in sorted((helpers.REPO / 'runtime' / 'workloads').glob('*.py')):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        names = [f'{node.module}.{a.name}' for a in node.names]
        assert node.level == 0, path
      else:
        continue
      for name in names:
        if not name.startswith('runtime'):
          continue
        front_door = (name == 'runtime' or
                      name.removeprefix('runtime.') in runtime.__all__)
        assert front_door or name.startswith('runtime.workloads.'), (
            f'{path.name} imports {name}')
