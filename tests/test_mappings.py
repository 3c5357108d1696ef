"""Flat fields of nested mappings, and what changed between two."""

import pytest

from runtime.common import mappings

pytestmark = pytest.mark.unit


def test_flatten_joins_keys_with_dots_and_turns_tuples_into_lists():
  nested = {
      'seed': 0,
      'optimizer': {
          'learning_rate': 0.1,
          'betas': (0.9, 0.99)
      }
  }
  assert mappings.flatten(nested) == {
      'optimizer.betas': [0.9, 0.99],
      'optimizer.learning_rate': 0.1,
      'seed': 0
  }
  assert list(mappings.flatten(nested, 'config')) == [
      'config.optimizer.betas', 'config.optimizer.learning_rate', 'config.seed'
  ]


def test_changes_name_each_field_added_removed_or_changed():
  before = {'a': 1, 'b': 2, 'c': 3}
  after = {'a': 1, 'b': 5, 'd': 4}
  assert mappings.changes(before, after) == [('b', 2, 5), ('c', 3, '(absent)'),
                                             ('d', '(absent)', 4)]
  assert mappings.changes(before, after,
                          lost='(missing)')[1] == ('c', 3, '(missing)')
  assert mappings.changes(before, dict(before)) == []
