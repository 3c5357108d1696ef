"""The code's shape: biggest modules, classes and functions, import circles,
and the imports across the project's parts.

  python scripts/code_sizes.py            # this repository
  python scripts/code_sizes.py --root=DIR --top=5

Reads launcher/, runtime/ and configs/ with `ast` (nothing is imported), and
counts every import between the project's modules, late ones inside
functions included. BUILD_NOTES.md's layout table comes from this.
"""

import argparse
import ast
import os
from typing import Iterator

PACKAGES = ('launcher', 'runtime', 'configs')


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
      graph[name].update(m for m in _imported(node, known)
                         if m in known and m != name)
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
  """Which of the project's parts a module belongs to (README, Layout)."""
  if module == 'launcher.rank' or module.startswith('launcher.rank.'):
    return 'launcher/rank'
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


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--root', default=os.path.dirname(
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


if __name__ == '__main__':
  main()
