"""Every entry of tests/pairs.py names a processes-tier test that exists."""

import ast
import pathlib

import pytest

from tests import pairs

pytestmark = pytest.mark.unit

TESTS = pathlib.Path(__file__).resolve().parent


def _test_names(module: pathlib.Path) -> set[str]:
  tree = ast.parse(module.read_text())
  return {
      node.name
      for node in tree.body
      if isinstance(node, ast.FunctionDef) and node.name.startswith('test_')
  }


def test_every_entry_names_an_existing_processes_test():
  missing = []
  for entry in pairs.VERSION_DEPENDENT:
    module, _, test = entry.partition('::')
    path = TESTS / module
    if not path.exists():
      missing.append(f'{entry}: no module {module}')
      continue
    if 'pytest.mark.processes' not in path.read_text():
      missing.append(f'{entry}: {module} is not a processes-tier module')
    if test and test not in _test_names(path):
      missing.append(f'{entry}: {module} has no {test}')
  assert not missing, '; '.join(missing)


def test_a_named_test_or_module_is_version_dependent_and_others_not():
  assert pairs.is_version_dependent('test_multihost.py', 'test_anything')
  assert pairs.is_version_dependent('test_preemption.py',
                                    'test_resume_is_exact_on_2x4')
  assert not pairs.is_version_dependent('test_preemption.py',
                                        'test_a_user_error_is_not_retried')
