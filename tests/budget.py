"""The suite's time budget: a test over SLOW_S seconds says why it costs
that, and none may take over MOST_S.

scripts/test.sh prints the fifteen slowest tests; tests/conftest.py adds, at
the end of a run, the tests whose call took over SLOW_S seconds and whose
function has no docstring (where its reason belongs: what it must wait for,
and what was already made cheaper). That is a line, not a failure: how long
a test takes is this machine's load as much as the test's. A call over
MOST_S fails (`over_most`), as pytest-timeout's 300 s a module would:
with the suite's two workers and more load beside them on 2 cores the
slowest test left (test_the_sharded_state_trains_as_the_replicated_one)
took 233 s on 2026-12-08, 160 s without the extra load; the local recipes,
300 s there, are now three tests of about a minute alone.

Example:
  >>> budget.unexplained({'tests/test_x.py::test_y[1]': 41.0}, root)
  ['tests/test_x.py::test_y[1] (41 s)']
"""

import ast
import functools
import pathlib
from typing import Optional

SLOW_S = 30.0
MOST_S = 300.0


def over_most(seconds: float, most_s: Optional[float] = None) -> str:
  """The failure's text for a call of `seconds`, or '' within the budget
  (`most_s`, MOST_S by default)."""
  most_s = MOST_S if most_s is None else most_s
  if seconds <= most_s:
    return ''
  return (f'the call took {seconds:.0f} s, over the suite\'s budget of '
          f'{most_s:g} s a test (tests/budget.py MOST_S): make it cheaper or '
          'split it (docs/tests.md)')


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
