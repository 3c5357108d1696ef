"""The habits .ci/run holds: the formatter's and the type checker's
settings, and the list of modules the type checker still passes over."""

import importlib.util
import tomllib

import pytest

from tests import helpers

pytestmark = pytest.mark.unit

# The modules with errors when the type checker came in; the list in
# pyproject.toml only shrinks.
MOST_UNCHECKED = 38


def _pyproject() -> dict:
  return tomllib.loads((helpers.REPO / 'pyproject.toml').read_text())


def test_the_type_checker_passes_over_no_more_modules_than_it_came_in_with():
  mypy = _pyproject()['tool']['mypy']
  assert mypy['files'] == ['launcher', 'runtime']
  unchecked = [m for o in mypy.get('overrides', []) for m in o['module']]
  assert len(unchecked) <= MOST_UNCHECKED, (
      f'{len(unchecked)} modules the type checker passes over, more than '
      f'{MOST_UNCHECKED}: fix the new one\'s errors instead of listing it')
  missing = [m for m in unchecked if importlib.util.find_spec(m) is None]
  assert not missing, f'listed, and no such module: {missing}'


def test_the_formatter_and_the_checker_are_pinned_in_the_test_extra():
  test_extra = _pyproject()['project']['optional-dependencies']['test']
  assert 'yapf==0.43.0' in test_extra and 'mypy==2.4.1' in test_extra
  assert _pyproject()['tool']['yapf']['indent_width'] == 2
