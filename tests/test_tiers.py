"""The test tiers hold: each module names one, and a module's tier says what
its tests cost (tests/conftest.py)."""

import types

import pytest

from tests import conftest
from tests import helpers

pytestmark = pytest.mark.unit


def test_launcher_processes_are_refused_outside_their_tier():
  with pytest.raises(AssertionError, match='move it to a processes-tier'):
    helpers.run_launcher(['--config=configs/linear_regression.py'])


def _item(name, module_marks, own_marks=()):
  module = types.SimpleNamespace(
      pytestmark=[getattr(pytest.mark, m) for m in module_marks])
  return types.SimpleNamespace(
      name=name,
      module=module,
      path=types.SimpleNamespace(name='test_x.py'),
      own_markers=[getattr(pytest.mark, m).mark for m in own_marks])


def test_a_test_of_another_tier_than_its_module_is_named():
  assert conftest.tier_problems([_item('test_a', ['unit'])]) == []
  assert conftest.tier_problems([_item('test_a', ['processes'],
                                       ['processes'])]) == []
  [problem] = conftest.tier_problems([_item('test_b', ['unit'], ['processes'])])
  assert 'test_b in test_x.py (unit) is marked processes' in problem
  [problem] = conftest.tier_problems([_item('test_c', [])])
  assert 'names no tier' in problem
  [problem] = conftest.tier_problems([_item('test_d', ['unit', 'devices'])])
  assert 'names unit, devices' in problem
