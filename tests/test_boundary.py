"""The three parts import one way, and the supervisor side never loads JAX.

The rule, module by module (docs/layout.md states it):

  runtime.common      -> runtime.common only; JAX, Flax, optax or orbax
                         only inside a function that a process of the job
                         calls, never the supervisor
  runtime (the rest)  -> runtime
  launcher.common     -> launcher.common, runtime.common; JAX-free as
                         runtime.common
  launcher.process       -> launcher.process, launcher.common, runtime
  launcher (the rest) -> launcher outside launcher.process, runtime.common
  launcher.tpu.worker, launcher.tpu.worker_accelerator -> each other only
                         (they run on a TPU VM without the project)
  configs             -> configs, runtime.config_base (a config is data:
                         ml_collections and the base config alone)

with one door: `launcher.cli`, when the launcher is itself a process of the
job, imports launcher.process inside the function that runs it (`_DOORS`).
An import is an `import`, a `from ... import` (relative ones resolved
against the importer's package) or `importlib.import_module` of a literal
name. A script in scripts/ imports nothing of tests/ (the benchmarks that
time the emulations live in tests/benchmarks/).
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
_DOORS = {('launcher.cli', 'launcher.process.distributed'),
          ('launcher.cli', 'launcher.process.dry_run'),
          ('launcher.cli', 'launcher.process.job')}


def _module_name(path) -> str:
  parts = list(path.relative_to(helpers.REPO).with_suffix('').parts)
  if parts[-1] == '__init__':
    parts.pop()
  return '.'.join(parts)


def project_modules() -> dict[str, ast.Module]:
  """{dotted name: parsed source} of every module in launcher/ and runtime/."""
  out = {}
  for top in ('launcher', 'runtime', 'configs'):
    for path in sorted((helpers.REPO / top).rglob('*.py')):
      out[_module_name(path)] = ast.parse(path.read_text(), str(path))
  return out


# The packages' __init__ modules, for relative imports.
def _packages(modules) -> set[str]:
  return {n for n in modules if any(m.startswith(n + '.') for m in modules)}


def imports(name: str,
            tree: ast.Module,
            package: bool = False) -> Iterator[tuple[str, bool]]:
  """(imported module, whether inside a function) for each import in tree.

  `from a.b import c` yields a.b.c; `_owner` then finds the module. A
  relative import is resolved against `name`'s package (`name` itself when
  `package`: an __init__), and `importlib.import_module('a.b')` counts as
  `import a.b` when its argument is a literal.
  """
  here = name.split('.') if package else name.split('.')[:-1]

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      inside = in_function or isinstance(
          child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
      if isinstance(child, ast.Import):
        for alias in child.names:
          yield alias.name, inside
      elif isinstance(child, ast.ImportFrom):
        base = child.module or ''
        if child.level:
          up = here[:len(here) - child.level + 1]
          base = '.'.join(up + ([base] if base else []))
        for alias in child.names:
          yield f'{base}.{alias.name}', inside
      elif (isinstance(child, ast.Call) and
            ast.unparse(child.func).endswith('import_module') and child.args and
            isinstance(child.args[0], ast.Constant) and
            isinstance(child.args[0].value, str)):
        yield child.args[0].value, inside
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
  if under(importer, 'configs'):
    return under(imported, 'configs') or imported == 'runtime.config_base'
  if under(importer, 'runtime.common'):
    return under(imported, 'runtime.common')
  if under(importer, 'runtime'):
    return under(imported, 'runtime')
  if under(importer, 'launcher.common'):
    return (under(imported, 'launcher.common') or
            under(imported, 'runtime.common'))
  if under(importer, 'launcher.process'):
    return (under(imported, 'launcher.process') or
            under(imported, 'launcher.common') or under(imported, 'runtime'))
  return ((under(imported, 'launcher') and
           not under(imported, 'launcher.process')) or
          under(imported, 'runtime.common'))


def violations(modules: dict[str, ast.Module]) -> list[str]:
  """Every import across the parts that the rule above forbids."""
  found = []
  packages = _packages(modules)
  for name, tree in modules.items():
    for imported, in_function in imports(name, tree, name in packages):
      top = imported.split('.')[0]
      if (top in _JAX and not in_function and name.startswith(
          ('runtime.common', 'launcher.common'))):
        found.append(f'{name} imports {imported}: {name.rsplit(".", 1)[0]} '
                     'is JAX-free')
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
  bad = [
      ('runtime.common.files', 'from runtime import metrics'),
      ('runtime.step', 'from launcher import restart'),
      ('launcher.restart', 'from runtime import train'),
      ('launcher.local.pod', 'from launcher.process import job'),
      ('runtime.common.progress', 'import jax'),
      ('launcher.tpu.worker', 'from runtime.common import handoff'),
      ('launcher.common.cluster', 'from launcher.process import peers'),
      ('launcher.common.workload', 'import jax'),
      # Spelled so that a search for the name misses them.
      ('runtime.metrics', 'importlib.import_module("launcher.restart")'),
      ('runtime.common.records', 'from .. import metrics'),
      ('launcher.local.pod', 'from ..process import job'),
      ('configs.mnist', 'from runtime import parallelism'),
  ]
  for importer, line in bad:
    tree = ast.parse(line)
    assert violations({**modules, importer: tree}), (importer, line)
  # The door is open only inside a function.
  at_top = ast.parse('from launcher.process import job')
  assert violations({
      **modules, 'launcher.cli': at_top
  }) == ['launcher.cli imports launcher.process.job']


def script_imports_of_tests(scripts: dict[str, ast.Module]) -> list[str]:
  """'script imports tests.x' for each import of tests/ in {name: source}."""
  found = []
  for name, tree in scripts.items():
    for imported, _ in imports(name, tree):
      if imported.split('.')[0] == 'tests':
        found.append(f'{name} imports {imported}')
  return sorted(found)


def script_sources() -> dict[str, ast.Module]:
  """{dotted name: parsed source} of every Python file in scripts/."""
  return {
      _module_name(path): ast.parse(path.read_text(), str(path))
      for path in sorted((helpers.REPO / 'scripts').rglob('*.py'))
  }


def test_scripts_import_nothing_of_tests():
  """What a user runs stands on the project alone; a benchmark that times
  the emulations lives beside them, in tests/benchmarks/."""
  scripts = script_sources()
  assert 'scripts.goodput' in scripts and 'scripts.side_by_side' in scripts
  assert script_imports_of_tests(scripts) == []


def test_the_check_finds_a_script_importing_tests():
  for line in ('from tests import helpers', 'import tests.gcs',
               'from tests.workloads import census',
               'importlib.import_module("tests.ray_cluster")',
               'def main():\n  from tests import tpu_emulation'):
    scripts = {**script_sources(), 'scripts.benchmark': ast.parse(line)}
    assert script_imports_of_tests(scripts), line


def supervisor_modules() -> list[str]:
  """Every module of launcher/ outside launcher/process/, and
  runtime/common/."""
  return sorted(
      n for n in project_modules()
      if (n.startswith('launcher') and not n.startswith('launcher.process')) or
      n.startswith('runtime.common'))


def test_the_list_covers_the_supervisor_side():
  names = supervisor_modules()
  assert {
      'launcher.cli', 'launcher.local.pod', 'launcher.local.monitor',
      'launcher.restart', 'launcher.tpu.driver', 'launcher.tpu.worker',
      'launcher.tpu.__main__', 'runtime.common.goodput'
  } <= set(names)
  assert not [n for n in names if n.startswith('launcher.process.')]


def test_no_supervisor_module_loads_jax():
  code = ('import importlib, sys, warnings\n'
          'warnings.simplefilter("ignore", DeprecationWarning)\n'
          f'for name in {supervisor_modules()!r}:\n'
          '  importlib.import_module(name)\n'
          'print(sorted(m for m in sys.modules\n'
          '             if m == "jax" or m.startswith(("jax.", "jaxlib"))))\n')
  result = subprocess.run([sys.executable, '-c', code],
                          cwd=helpers.REPO,
                          capture_output=True,
                          text=True,
                          timeout=120,
                          check=False)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == '[]', result.stdout


def test_only_the_ray_driver_imports_ray():
  """Ray is an extra: nothing every deployment runs imports it."""
  modules = project_modules()
  packages = _packages(modules)
  found = sorted({
      name for name, tree in modules.items()
      for imported, _ in imports(name, tree, name in packages)
      if imported.split('.')[0] == 'ray' and not name.startswith('launcher.ray')
  })
  assert found == []
  assert any(
      imported.split('.')[0] == 'ray' for imported, _ in imports(
          'launcher.ray.group', modules['launcher.ray.group']))


def _binds_the_record_layout_twice(tree: ast.Module) -> list[int]:
  """The lines where a module that imports runtime.common.layout (where
  the record's files are) binds `layout` to something else (a batch's
  microbatches.Layout: call it batch_layout)."""
  imports = any(
      isinstance(node, ast.ImportFrom) and node.module == 'runtime.common' and
      any(a.name == 'layout' and a.asname is None
          for a in node.names)
      for node in ast.walk(tree))
  if not imports:
    return []
  return [
      node.lineno
      for node in ast.walk(tree)
      if (isinstance(node, ast.arg) and node.arg == 'layout') or
      (isinstance(node, ast.Name) and node.id == 'layout' and
       isinstance(node.ctx, ast.Store))
  ]


def test_layout_means_one_thing_where_the_record_layout_is_imported():
  twice = {
      name: lines
      for name, tree in project_modules().items()
      if (lines := _binds_the_record_layout_twice(tree))
  }
  assert not twice, twice
  caught = ast.parse('from runtime.common import layout\n'
                     'def f(layout): return layout.Record\n')
  assert _binds_the_record_layout_twice(caught) == [2]


def _job_life_calls(tree: ast.Module) -> list[str]:
  """What in `tree` runs a job's life: a call of `ready(now)` or
  `grow_due(now)` on anything (a capacity's elastic cycle), or of
  `Attempt.run()` inside a loop (a restart loop)."""
  found = []
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Call) and
            isinstance(node.func, ast.Attribute)):
      continue
    if node.func.attr in ('ready', 'grow_due') and len(node.args) == 1:
      found.append(f'{node.func.attr}() at line {node.lineno}')
  for loop in ast.walk(tree):
    if not isinstance(loop, ast.While):
      continue
    for node in ast.walk(loop):
      if (isinstance(node, ast.Call) and
          isinstance(node.func, ast.Attribute) and node.func.attr == 'run' and
          not node.args and isinstance(node.func.value, ast.Name) and
          node.func.value.id in ('attempt', 'one', 'pod', 'gang')):
        found.append(f'an attempt run in a loop at line {node.lineno}')
  return found


def test_only_the_job_agent_runs_a_jobs_life():
  """The restart loop and the elastic cycle (a capacity's `ready` and
  `grow_due`) are the agent's alone (launcher/agent.py); a launcher
  supplies its attempts and its capacity."""
  outside = {}
  for name, tree in project_modules().items():
    if name == 'launcher.agent' or not name.startswith('launcher'):
      continue
    calls = _job_life_calls(tree)
    if calls:
      outside[name] = calls
  assert not outside, outside
  calls = _job_life_calls(project_modules()['launcher.agent'])
  assert any(c.startswith('ready()') for c in calls), calls
  assert any(c.startswith('grow_due()') for c in calls), calls
  assert any(c.startswith('an attempt run') for c in calls), calls


def test_the_elastic_policy_is_made_in_the_agent_alone():
  """A launcher says its job is elastic (agent.Job.elastic); the one
  `elastic.Policy` that decides each resize is the agent's to make."""
  makers = []
  for name, tree in project_modules().items():
    for node in ast.walk(tree):
      if (isinstance(node, ast.Call) and
          isinstance(node.func, ast.Attribute) and node.func.attr == 'Policy'):
        makers.append(name)
  assert makers == ['launcher.agent'], makers
