"""The three parts import one way, and the supervisor side never loads JAX.

The rule, module by module (the README's Layout states it):

  runtime.common      -> runtime.common only; JAX, Flax, optax or orbax
                         only inside a function that a process of the job
                         calls, never the supervisor
  runtime (the rest)  -> runtime
  launcher.rank       -> launcher.rank, runtime
  launcher (the rest) -> launcher outside launcher.rank, runtime.common
  launcher.tpu.worker, launcher.tpu.worker_accelerator -> each other only
                         (they run on a TPU VM without the project)

with one door: `launcher.cli`, when the launcher is itself a process of the
job, imports launcher.rank inside the function that runs it (`_DOORS`).
"""

import ast
import subprocess
import sys
from typing import Iterator

import pytest

from tests import helpers

pytestmark = pytest.mark.unit

_PROJECT = ('launcher', 'runtime', 'configs')
_JAX = ('jax', 'jaxlib', 'flax', 'optax', 'orbax')
_STANDALONE = ('launcher.tpu.worker', 'launcher.tpu.worker_accelerator')
# (importer, imported): allowed only inside a function.
_DOORS = {('launcher.cli', 'launcher.rank.distributed'),
          ('launcher.cli', 'launcher.rank.dry_run'),
          ('launcher.cli', 'launcher.rank.process'),
          ('launcher.cli', 'launcher.rank.supervisor')}


def _module_name(path) -> str:
  parts = list(path.relative_to(helpers.REPO).with_suffix('').parts)
  if parts[-1] == '__init__':
    parts.pop()
  return '.'.join(parts)


def project_modules() -> dict[str, ast.Module]:
  """{dotted name: parsed source} of every module in launcher/ and runtime/."""
  out = {}
  for top in ('launcher', 'runtime'):
    for path in sorted((helpers.REPO / top).rglob('*.py')):
      out[_module_name(path)] = ast.parse(path.read_text(), str(path))
  return out


def imports(name: str, tree: ast.Module) -> Iterator[tuple[str, bool]]:
  """(imported module, whether inside a function) for each import in tree.

  `from a.b import c` yields a.b.c; `_owner` then finds the module. The
  project imports absolutely only (`name` is for the messages).
  """
  del name
  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      inside = in_function or isinstance(
          child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
      if isinstance(child, ast.Import):
        for alias in child.names:
          yield alias.name, inside
      elif isinstance(child, ast.ImportFrom):
        base = '.' * child.level + (child.module or '')
        for alias in child.names:
          yield f'{base}.{alias.name}', inside
      yield from visit(child, inside)
  yield from visit(tree, False)


def _owner(imported: str, modules) -> str:
  """The project module an import names: a.b.c if it exists, else a.b."""
  while imported and imported not in modules:
    imported = imported.rpartition('.')[0]
  return imported


def _allowed(importer: str, imported: str) -> bool:
  def under(module, package):
    return module == package or module.startswith(package + '.')
  if importer in _STANDALONE:
    return imported in _STANDALONE
  if under(importer, 'runtime.common'):
    return under(imported, 'runtime.common')
  if under(importer, 'runtime'):
    return under(imported, 'runtime')
  if under(importer, 'launcher.rank'):
    return under(imported, 'launcher.rank') or under(imported, 'runtime')
  return ((under(imported, 'launcher') and
           not under(imported, 'launcher.rank')) or
          under(imported, 'runtime.common'))


def violations(modules: dict[str, ast.Module]) -> list[str]:
  """Every import across the parts that the rule above forbids."""
  found = []
  for name, tree in modules.items():
    for imported, in_function in imports(name, tree):
      top = imported.split('.')[0]
      if (top in _JAX and not in_function and
          name.startswith('runtime.common')):
        found.append(f'{name} imports {imported}: runtime/common is JAX-free')
        continue
      if top not in _PROJECT:
        continue
      owner = _owner(imported, modules) or imported
      if _allowed(name, owner):
        continue
      if in_function and (name, owner) in _DOORS:
        continue
      found.append(f'{name} imports {owner}')
  return sorted(set(found))


def test_imports_run_one_way():
  assert violations(project_modules()) == []


def test_the_check_finds_an_import_against_the_rule():
  modules = project_modules()
  bad = {
      'runtime.common.files': 'from runtime import metrics',
      'runtime.step': 'from launcher import restart',
      'launcher.restart': 'from runtime import train',
      'launcher.local.pod': 'from launcher.rank import process',
      'runtime.common.progress': 'import jax',
      'launcher.tpu.worker': 'from runtime.common import env_vars',
  }
  for importer, line in bad.items():
    tree = ast.parse(line)
    assert violations({**modules, importer: tree}), (importer, line)
  # The door is open only inside a function.
  at_top = ast.parse('from launcher.rank import process')
  assert violations({**modules, 'launcher.cli': at_top}) == [
      'launcher.cli imports launcher.rank.process']


def supervisor_modules() -> list[str]:
  """Every module of launcher/ outside launcher/rank/, and runtime/common/."""
  return sorted(n for n in project_modules()
                if (n.startswith('launcher') and
                    not n.startswith('launcher.rank')) or
                n.startswith('runtime.common'))


def test_the_list_covers_the_supervisor_side():
  names = supervisor_modules()
  assert {'launcher.cli', 'launcher.local.pod', 'launcher.local.monitor',
          'launcher.restart', 'launcher.tpu.driver', 'launcher.tpu.worker',
          'launcher.tpu.__main__', 'runtime.common.goodput'} <= set(names)
  assert not [n for n in names if n.startswith('launcher.rank.')]


def test_no_supervisor_module_loads_jax():
  code = ('import importlib, sys, warnings\n'
          'warnings.simplefilter("ignore", DeprecationWarning)\n'
          f'for name in {supervisor_modules()!r}:\n'
          '  importlib.import_module(name)\n'
          'print(sorted(m for m in sys.modules\n'
          '             if m == "jax" or m.startswith(("jax.", "jaxlib"))))\n')
  result = subprocess.run([sys.executable, '-c', code], cwd=helpers.REPO,
                          capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == '[]', result.stdout
