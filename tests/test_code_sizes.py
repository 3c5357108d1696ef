"""scripts/code_sizes.py: sizes and import circles, and none in the project."""

import importlib.util

import pytest

from tests import helpers

pytestmark = pytest.mark.unit


def _code_sizes():
  spec = importlib.util.spec_from_file_location(
      'code_sizes', helpers.REPO / 'scripts' / 'code_sizes.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_circles_finds_each_cycle_once():
  circles = _code_sizes().circles
  assert circles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [
      ['a', 'b', 'c']]
  assert circles({'a': {'b'}, 'b': set()}) == []


def test_the_project_has_no_import_circle():
  module = _code_sizes()
  module_sizes, _, _, graph = module.measure(str(helpers.REPO))
  assert module.circles(graph) == []
  assert 'launcher.tpu.driver' in graph
  assert {name for _, name in module_sizes} == set(graph)
