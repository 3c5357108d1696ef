"""tests/budget.py: which slow tests do not say why they are slow."""

import pytest

from tests import budget

pytestmark = pytest.mark.unit


def test_a_slow_test_without_a_docstring_is_named_and_others_not(tmp_path):
  (tmp_path / 'test_m.py').write_text(
      'def test_explained():\n'
      '  """Waits for two preemptions of the emulated slice."""\n'
      'def test_silent():\n'
      '  pass\n'
      'class TestGroup:\n'
      '  def test_in_class(self):\n'
      '    pass\n')
  durations = {
      'test_m.py::test_explained': 45.0,
      'test_m.py::test_silent[1-True]': 31.0,
      'test_m.py::test_silent[0-False]': 12.0,
      'test_m.py::TestGroup::test_in_class': 60.0
  }
  assert budget.unexplained(durations, tmp_path) == [
      'test_m.py::TestGroup::test_in_class (60 s)',
      'test_m.py::test_silent[1-True] (31 s)'
  ]


def test_a_missing_module_counts_as_unexplained(tmp_path):
  assert budget.unexplained({'gone.py::test_x': 40.0},
                            tmp_path) == ['gone.py::test_x (40 s)']


def test_a_call_over_the_most_a_test_may_take_fails_with_the_budget_named():
  assert budget.over_most(budget.MOST_S) == ''
  said = budget.over_most(budget.MOST_S + 1)
  assert said.startswith(f'the call took {budget.MOST_S + 1:.0f} s, over the '
                         f"suite's budget of {budget.MOST_S:g} s a test"), said
  assert budget.over_most(2.0, most_s=1.0).startswith('the call took 2 s')
