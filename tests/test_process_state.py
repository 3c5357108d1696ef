"""tests/process_state.py and the test order: every module-level state of
runtime/ and launcher/ is put back after a test or kept for a reason, and
PODRUN_TEST_ORDER reorders modules without splitting one."""

import ast
import os
import pathlib
import signal
import types

import pytest

from runtime import compile_events
from runtime import coordination
from runtime.common import goodput
from runtime.common import progress
from launcher.common import record_mirror
from tests import conftest
from tests import process_state

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Calls whose result nobody mutates: a module may hold them freely.
_CONSTANT_CALLS = ('re.compile', 'frozenset', 'tuple', 'logging.getLogger',
                   'typing.TypeVar', 'collections.namedtuple')


def _module_state(path: pathlib.Path) -> set[str]:
  """The module-level names of `path` that can hold state: rebound by a
  `global` statement, or lower-case and bound to a mutable value (a list,
  dict or set, or what a call other than _CONSTANT_CALLS returns)."""
  tree = ast.parse(path.read_text())
  rebound = {
      name for node in ast.walk(tree) if isinstance(node, ast.Global)
      for name in node.names
  }
  out = set()
  for node in tree.body:
    if isinstance(node, ast.Assign):
      names = [t.id for t in node.targets if isinstance(t, ast.Name)]
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
      names = [node.target.id] if isinstance(node.target, ast.Name) else []
    else:
      continue
    value = node.value
    mutable = isinstance(
        value,
        (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp,
         ast.SetComp)) or (isinstance(value, ast.Call) and
                           ast.unparse(value.func) not in _CONSTANT_CALLS)
    out |= {
        n for n in names
        if n in rebound or (mutable and n.islower() and not n.startswith('__'))
    }
  return out


def test_every_module_state_is_made_fresh_or_kept_for_a_reason():
  found = set()
  for part in ('runtime', 'launcher'):
    for path in sorted((ROOT / part).rglob('*.py')):
      module = '.'.join(path.relative_to(ROOT).with_suffix('').parts)
      found |= {(module.removesuffix('.__init__'), name)
                for name in _module_state(path)}
  known = set(process_state.FRESH) | set(process_state.KEPT)
  assert found - known == set(), (
      'module-level state that a test could leave to the next: add it to '
      'tests/process_state.FRESH (with how to make it fresh) or KEPT (with '
      'why it may stay)')
  assert known - found == set(), 'tests/process_state.py names state gone'


def test_fresh_state_for_the_test_and_the_old_back_after_it():
  before_progress, before_ledger = progress._progress, goodput.current()
  before_handler = signal.getsignal(signal.SIGUSR1)
  saved = process_state.fresh()
  assert progress._progress is not before_progress
  assert goodput.current() is not before_ledger
  assert record_mirror._current is None
  local_dir = os.environ['PODRUN_LOCAL_CHECKPOINT_DIR']
  assert os.path.isdir(local_dir)
  # What a test might leave behind.
  progress.report(7, process_index=0)
  coordination.set_default_timeout(1.0)
  compile_events._seconds_callbacks.append(print)
  signal.signal(signal.SIGUSR1, lambda *_: None)
  os.environ['SLURM_PROCID'] = '3'
  os.environ['PODRUN_TEST_ORDER'] = 'reverse'
  process_state.restore(saved)
  assert progress._progress is before_progress
  assert goodput.current() is before_ledger
  assert coordination.default_timeout() == coordination.DEFAULT_TIMEOUT_S
  assert print not in compile_events._seconds_callbacks
  assert signal.getsignal(signal.SIGUSR1) == before_handler
  assert 'SLURM_PROCID' not in os.environ
  assert os.environ.get('PODRUN_TEST_ORDER') == saved.environ.get(
      'PODRUN_TEST_ORDER')
  assert not os.path.exists(local_dir)


def test_each_test_has_its_own_local_tier_and_record_copies(tmp_path):
  del tmp_path
  for variable in process_state.PER_TEST_DIRS:
    assert os.path.isdir(os.environ[variable])
    assert os.listdir(os.environ[variable]) == []


def _items(spec: str) -> list:
  """Fake test items: 'a1 a2 b1' is tests 1 and 2 of module a, 1 of b."""
  return [
      types.SimpleNamespace(path=pathlib.Path(f'test_{n[0]}.py'), name=n)
      for n in spec.split()
  ]


def test_a_reorder_keeps_each_module_together():
  items = _items('a1 a2 a3 b1 b2 c1 d1 d2 d3 d4')
  assert conftest.reordered(items, '') == items
  assert [i.name for i in conftest.reordered(items, 'reverse')
         ] == ('d1 d2 d3 d4 c1 b1 b2 a1 a2 a3'.split())
  shuffled = [i.name for i in conftest.reordered(items, 'shuffle:7')]
  assert shuffled == [i.name for i in conftest.reordered(items, 'shuffle:7')]
  assert sorted(shuffled) == sorted(i.name for i in items)
  modules = [name[0] for name in shuffled]
  runs = [m for k, m in enumerate(modules) if k == 0 or modules[k - 1] != m]
  assert len(runs) == 4, shuffled  # each module in one stretch
  assert shuffled != [i.name for i in conftest.reordered(items, 'shuffle:8')]
  with pytest.raises(pytest.UsageError, match='reverse or shuffle:SEED'):
    conftest.reordered(items, 'random')
