"""What a launcher tells each process crosses as one typed value
(runtime/common/handoff.py), and nothing else names podrun's variables."""

import ast
import dataclasses

import pytest

from runtime.common import handoff
from tests import helpers
from runtime.common import layout

pytestmark = pytest.mark.unit

# Beside the hand-off module, what runs on a TPU VM without the project
# spells the names it sets (tests/test_tpu_worker.py holds them equal).
_NAMING = {
    'runtime/common/handoff.py', 'launcher/tpu/worker.py',
    'launcher/tpu/worker_accelerator.py'
}
_VARIABLES = {
    value for name, value in vars(handoff).items()
    if name.isupper() and isinstance(value, str)
}


def test_every_field_goes_through_the_environment_and_back():
  told = handoff.Handoff(coordinator_address='10.0.0.1:8476',
                         coordinator_bind_address='[::]:8476',
                         num_processes=4,
                         process_id=3,
                         tls_dir='~/podrun/tls/j',
                         job_id='j',
                         attempt='j-a2',
                         expected_processes=4,
                         elastic=(2, 4),
                         elastic_slices=True,
                         supervised=True,
                         launcher_record=True,
                         progress_fd=7,
                         gone_file='/tmp/gone.json')
  env = told.env()
  assert set(env) == set(handoff.NAMES)  # Every field set, every name.
  assert env[handoff.ELASTIC_PROCESSES] == '2-4'
  assert env[handoff.SUPERVISED] == '1'
  assert handoff.Handoff.read(env) == told
  # Nothing told, nothing set; an empty variable tells nothing.
  assert handoff.Handoff().env() == {}
  assert handoff.Handoff.read({handoff.JOB_ID: ''}) == handoff.Handoff()


@pytest.mark.parametrize('name, value, words', [
    (handoff.NUM_PROCESSES, 'four', "PODRUN_NUM_PROCESSES='four' is not an "
     'integer'),
    (handoff.ELASTIC_PROCESSES, '2', 'is not "K-P"'),
    (handoff.ELASTIC_PROCESSES, '4-2', 'K=4 and P=2 need 0 < K <= P'),
])
def test_a_bad_value_is_refused_naming_its_variable(name, value, words):
  with pytest.raises(handoff.HandoffError, match=words):
    handoff.Handoff.read({name: value})


def test_the_process_reads_it_once_and_the_runtime_takes_it_from_there(
    monkeypatch):
  from runtime import options as options_lib  # pylint: disable=g-import-not-at-top
  from configs import linear_regression  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(handoff.ATTEMPT, 'from-the-environment')
  assert handoff.current().attempt == 'from-the-environment'
  told = handoff.Handoff(attempt='j-a3', elastic=(1, 2))
  handoff.use(told)
  try:
    monkeypatch.setenv(handoff.ATTEMPT, 'changed-later')
    assert handoff.current() is told
    options = options_lib.TrainOptions.of(linear_regression.get_config(),
                                          layout.Record('/w'))
    assert (options.attempt, options.elastic) == ('j-a3', (1, 2))
  finally:
    handoff.use(None)
  assert dataclasses.replace(told, attempt=None).env() == {
      handoff.ELASTIC_PROCESSES: '1-2'
  }


def _docstrings(tree: ast.AST) -> set[int]:
  """ids of the docstring nodes in `tree`."""
  out = set()
  for node in ast.walk(tree):
    if isinstance(
        node,
        (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if (body and isinstance(body[0], ast.Expr) and
          isinstance(body[0].value, ast.Constant)):
        out.add(id(body[0].value))
  return out


def naming_sites(source: str) -> list[str]:
  """Where `source` names a variable of the hand-off other than through
  `Handoff` and `handoff.variable`: a string holding one, or one of the
  module's constants."""
  tree = ast.parse(source)
  docs = _docstrings(tree)
  found = []
  for node in ast.walk(tree):
    if (isinstance(node, ast.Constant) and isinstance(node.value, str) and
        id(node) not in docs):
      named = sorted(v for v in _VARIABLES if v in node.value)
      if named:
        found.append(f'line {node.lineno}: {", ".join(named)}')
    elif (isinstance(node, ast.Attribute) and
          isinstance(getattr(handoff, node.attr, None), str) and
          getattr(handoff, node.attr) in _VARIABLES and
          isinstance(node.value, ast.Name) and node.value.id == 'handoff'):
      found.append(f'line {node.lineno}: handoff.{node.attr}')
    elif isinstance(node, ast.ImportFrom) and any(
        a.name == 'env_vars' for a in node.names):
      found.append(f'line {node.lineno}: env_vars')
  return found


def test_no_module_but_the_hand_off_names_its_variables():
  sites = []
  for top in ('launcher', 'runtime', 'configs'):
    for path in sorted((helpers.REPO / top).rglob('*.py')):
      relative = str(path.relative_to(helpers.REPO))
      if relative in _NAMING:
        continue
      sites += [f'{relative} {s}' for s in naming_sites(path.read_text())]
  assert not sites, (
      'build a handoff.Handoff and use env(), or read one with '
      'Handoff.read / handoff.current() (handoff.variable names one in a '
      'message):\n' + '\n'.join(sites))


def test_the_check_finds_each_way_of_naming_one():
  assert naming_sites("os.environ.get('PODRUN_JOB_ID')")
  assert naming_sites("env = {handoff.ATTEMPT: 'a'}")
  assert naming_sites("words = [f'PODRUN_ATTEMPT={attempt}']")
  assert naming_sites('from runtime.common import env_vars')
  assert not naming_sites('"""Reads PODRUN_JOB_ID."""\nx = 1')
  assert not naming_sites("name = handoff.variable('job_id')")
