"""The suite's time budget: a test over SLOW_S seconds says why it costs that.

scripts/test.sh prints the ten slowest tests; tests/conftest.py adds, at the
end of a run, the tests whose call took over SLOW_S seconds and whose
function has no docstring (where its reason belongs: what it must wait for,
and what was already made cheaper). A line, not a failure: how long a test
takes is this machine's load as much as the test's.

Example:
  >>> budget.unexplained({'tests/test_x.py::test_y[1]': 41.0}, root)
  ['tests/test_x.py::test_y[1] (41 s)']
"""

import ast
import functools
import pathlib

SLOW_S = 30.0


@functools.lru_cache(maxsize=None)
def _docstrings(path: pathlib.Path) -> dict[str, str]:
  """Test function name -> its docstring ('' for none), for one module."""
  try:
    tree = ast.parse(path.read_text())
  except (OSError, SyntaxError):
    return {}
  return {
      node.name: ast.get_docstring(node) or ''
      for node in ast.walk(tree)
      if isinstance(node, ast.FunctionDef)
  }


def unexplained(durations: dict[str, float],
                root: pathlib.Path,
                slow_s: float = SLOW_S) -> list[str]:
  """The tests over `slow_s` whose function has no docstring.

  Args:
    durations: a test's node id (`tests/m.py::test_f[param]`) -> the
      seconds its call took.
    root: the directory node ids are relative to.
    slow_s: what counts as slow.

  Returns:
    'node id (N s)' for each, slowest first.
  """
  found = []
  for node_id, seconds in sorted(durations.items(), key=lambda i: -i[1]):
    if seconds <= slow_s:
      continue
    module, _, test = node_id.partition('::')
    name = test.split('[', 1)[0].split('::')[-1]
    if not _docstrings(root / module).get(name):
      found.append(f'{node_id} ({seconds:.0f} s)')
  return found
