"""Nested mappings as flat 'a.b' fields, and what changed between two.

The resume check, the agreement between processes and the structure checks
all compare such fields and say every one that differs, the same way.

Example:
  >>> flatten({'optimizer': {'learning_rate': 0.1}, 'seed': 0})
  {'optimizer.learning_rate': 0.1, 'seed': 0}
  >>> changes({'a': 1, 'b': 2}, {'a': 1, 'c': 3})
  [('b', 2, '(absent)'), ('c', '(absent)', 3)]
"""

from typing import Any, Mapping

# What `changes` gives for a field that one side lacks.
ABSENT = '(absent)'


def flatten(value: Any, prefix: str = '') -> dict[str, Any]:
  """{'a.b': leaf} for every leaf of nested mappings, in sorted key order.

  Args:
    value: a mapping (anything with `items`) of mappings and leaves.
    prefix: put before every field, joined with '.': 'config' gives
      'config.a.b'.

  Returns:
    the leaves, tuples turned into lists (as JSON and ConfigDict read back).
  """
  if hasattr(value, 'items'):
    out = {}
    for key, inner in sorted(value.items(), key=lambda item: str(item[0])):
      out.update(flatten(inner, f'{prefix}.{key}' if prefix else str(key)))
    return out
  return {prefix: list(value) if isinstance(value, tuple) else value}


def changes(before: Mapping[str, Any],
            after: Mapping[str, Any],
            lost: str = ABSENT) -> list[tuple[str, Any, Any]]:
  """(field, before, after) for every field whose value differs, sorted.

  Args:
    before, after: {field: value}.
    lost: what a field that only `before` has reads as on the `after` side
      (the structure checks say '(missing)' for a leaf a step dropped).
      A field only `after` has reads as ABSENT before.
  """
  return [(key, before.get(key, ABSENT), after.get(key, lost))
          for key in sorted(set(before) | set(after))
          if before.get(key, ABSENT) != after.get(key, lost)]
