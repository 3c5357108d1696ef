"""The code's shape: biggest modules, classes and functions, import circles,
the imports across the project's parts, and what the house keeps down.

  python scripts/code_sizes.py            # this repository
  python scripts/code_sizes.py --root=DIR --top=5

Reads launcher/, runtime/ and configs/ with `ast` (nothing of DIR is
imported), and counts every import between the project's modules, late
ones inside functions included. BUILD_NOTES.md's layout table comes from
this, and so do the house's figures (`house`): `global` statements,
runtime functions that take a whole config, modules that spell a path of
the workdir themselves rather than asking its layout, `getattr` reads on
attempts in the restart loop and the elastic policies, the names the
process index goes by, and the modules in runtime/'s root.
"""

import argparse
import ast
import os
import re
from typing import Iterator

PACKAGES = ('launcher', 'runtime', 'configs')
# What a job writes in its workdir (runtime/common/layout.py's names; fixed
# here so that an old checkout, from before that module, counts the same).
WORKDIR_NAMES = ('summary.json', 'goodput.jsonl', 'metrics.jsonl',
                 'tensorboard', 'device_batch_limit.json', 'ranks', 'goodput',
                 'stall', 'logs', 'attempts.jsonl', 'job.json', 'checkpoints',
                 'compilation_cache', '.podrun', '.podrun_lease.json', 'join')
_PATH_CALLS = ('path.join', 'open', 'glob', 'Path', 'makedirs', 'exists')
_FILE_IN_TEXT = re.compile(
    r'rank_|/(?:%s)(?:$|[/"\'\s])' %
    '|'.join(re.escape(n) for n in WORKDIR_NAMES if '.' in n))
# The restart loop and the elastic policies, where an attempt's end is read.
_POLICIES = ('launcher.restart', 'launcher.resize', 'launcher.elastic',
             'launcher.local.elastic', 'launcher.tpu.elastic',
             'launcher.ray.elastic')
PROCESS_INDEX_NAMES = ('process_index', 'rank', 'process_id')


def modules(root: str) -> dict[str, str]:
  """{dotted module name: path} of every .py file under PACKAGES."""
  found = {}
  for package in PACKAGES:
    for directory, _, names in os.walk(os.path.join(root, package)):
      for name in names:
        if name.endswith('.py'):
          path = os.path.join(directory, name)
          dotted = os.path.relpath(path, root)[:-3].replace(os.sep, '.')
          found[dotted.removesuffix('.__init__')] = path
  return found


def _imported(node: ast.AST, known: dict[str, str]) -> Iterator[str]:
  if isinstance(node, ast.Import):
    yield from (a.name for a in node.names)
  elif isinstance(node, ast.ImportFrom) and node.module:
    for alias in node.names:
      full = f'{node.module}.{alias.name}'
      yield full if full in known else node.module


def measure(root: str) -> tuple[list, list, list, dict[str, set[str]]]:
  """(module sizes, class sizes, function sizes, import graph).

  Sizes are (lines, name) pairs; the graph maps a module to the project
  modules it imports.
  """
  known = modules(root)
  module_sizes, class_sizes, function_sizes, graph = [], [], [], {}
  for name, path in known.items():
    with open(path) as f:
      source = f.read()
    module_sizes.append((len(source.splitlines()), name))
    graph[name] = set()
    for node in ast.walk(ast.parse(source)):
      span = getattr(node, 'end_lineno', 0) - getattr(node, 'lineno', 0) + 1
      if isinstance(node, ast.ClassDef):
        class_sizes.append((span, f'{name}.{node.name}'))
      elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        function_sizes.append((span, f'{name}.{node.name}'))
      graph[name].update(
          m for m in _imported(node, known) if m in known and m != name)
  return module_sizes, class_sizes, function_sizes, graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Every import circle, each once, as its modules sorted.

  Example:
    >>> circles({'a': {'b'}, 'b': {'a'}, 'c': set()})
    [['a', 'b']]
  """
  # Strongly connected components (Tarjan), kept when they hold a cycle.
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(node: str) -> None:
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for other in graph.get(node, ()):
      if other not in index:
        visit(other)
        low[node] = min(low[node], low[other])
      elif other in on_stack:
        low[node] = min(low[node], index[other])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1 or node in graph.get(node, ()):
        found.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return sorted(found)


def part(module: str) -> str:
  """Which of the project's parts a module belongs to (docs/layout.md)."""
  if module == 'launcher.process' or module.startswith('launcher.process.'):
    return 'launcher/process'
  if module.startswith('runtime.common'):
    return 'runtime/common'
  return module.split('.')[0]


def crossings(graph: dict[str, set[str]]) -> dict[tuple[str, str], int]:
  """{(importing part, imported part): modules pairs} for every import
  from one part into another."""
  out: dict[tuple[str, str], int] = {}
  for importer, imported in graph.items():
    for module in imported:
      key = (part(importer), part(module))
      if key[0] != key[1]:
        out[key] = out.get(key, 0) + 1
  return dict(sorted(out.items()))


def spells_a_workdir_path(tree: ast.Module) -> bool:
  """Whether a module builds a path of the workdir from its own literals:
  a workdir name first in a path call's string, or a `rank_` or
  `/summary.json`-like piece of an f-string."""
  for node in ast.walk(tree):
    if (isinstance(node, ast.Call) and
        ast.unparse(node.func).endswith(_PATH_CALLS)):
      for leaf in (c for a in node.args for c in ast.walk(a)):
        if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str):
          if (leaf.value.strip('/').split('/')[0] in WORKDIR_NAMES or
              'rank_' in leaf.value):
            return True
    if isinstance(node, ast.JoinedStr):
      text = ''.join(
          v.value for v in node.values if isinstance(v, ast.Constant))
      if _FILE_IN_TEXT.search(text):
        return True
  return False


def _identifier(node: ast.AST):
  for kind, field in ((ast.Name, 'id'), (ast.Attribute, 'attr'),
                      (ast.arg, 'arg'), (ast.keyword, 'arg')):
    if isinstance(node, kind):
      return getattr(node, field)
  return None


def house(root: str) -> dict:
  """The house's figures: {name: count}, and the modules that spell a
  workdir path themselves (`path_spellers`, the layout itself left out)."""
  out = dict(globals=0,
             config_functions=0,
             config_modules=set(),
             attempt_getattrs=0,
             path_spellers=[],
             runtime_root=0,
             **{name: 0 for name in PROCESS_INDEX_NAMES})
  for name, path in sorted(modules(root).items()):
    with open(path) as f:
      tree = ast.parse(f.read())
    # Files of runtime/ itself, its __init__ too; not its subpackages.
    out['runtime_root'] += os.path.dirname(path) == os.path.join(
        root, 'runtime')
    if name != 'runtime.common.layout' and spells_a_workdir_path(tree):
      out['path_spellers'].append(name)
    for node in ast.walk(tree):
      out['globals'] += isinstance(node, ast.Global)
      if (name.startswith('runtime') and
          isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and
          'config' in [a.arg for a in node.args.args + node.args.kwonlyargs]):
        out['config_functions'] += 1
        out['config_modules'].add(name)
      if (name in _POLICIES and isinstance(node, ast.Call) and
          ast.unparse(node.func) in ('getattr', 'hasattr') and
          ast.unparse(node.args[0]) != 'self'):
        out['attempt_getattrs'] += 1
      if _identifier(node) in PROCESS_INDEX_NAMES:
        out[_identifier(node)] += 1
  out['config_modules'] = len(out['config_modules'])
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--root',
                      default=os.path.dirname(
                          os.path.dirname(os.path.abspath(__file__))))
  parser.add_argument('--top', type=int, default=3)
  args = parser.parse_args()
  module_sizes, class_sizes, function_sizes, graph = measure(args.root)
  for title, sizes in (('modules', module_sizes), ('classes', class_sizes),
                       ('functions', function_sizes)):
    print(f'biggest {title}:')
    for lines, name in sorted(sizes, reverse=True)[:args.top]:
      print(f'  {lines:4d}  {name}')
  print('import circles:', circles(graph) or 'none')
  print('imports across the parts (module pairs):')
  for (importer, imported), count in crossings(graph).items():
    print(f'  {count:4d}  {importer} -> {imported}')
  print('the house:')
  for key, value in house(args.root).items():
    print(f'  {key}: {value}')


if __name__ == '__main__':
  main()
