"""The supervisor side (launcher/ outside launcher/rank/) never imports JAX."""

import subprocess
import sys

import pytest

from tests import helpers

pytestmark = pytest.mark.unit


def supervisor_modules() -> list[str]:
  """Every module of launcher/ outside launcher/rank/, as a dotted name."""
  root = helpers.REPO / 'launcher'
  names = []
  for path in sorted(root.rglob('*.py')):
    relative = path.relative_to(helpers.REPO).with_suffix('')
    if 'rank' in relative.parts[1:2]:
      continue
    parts = list(relative.parts)
    if parts[-1] == '__init__':
      parts.pop()
    names.append('.'.join(parts))
  return names


def test_the_list_covers_the_supervisor_side():
  names = supervisor_modules()
  assert {'launcher.cli', 'launcher.local.pod', 'launcher.local.monitor',
          'launcher.restart', 'launcher.tpu.driver', 'launcher.tpu.worker',
          'launcher.tpu.__main__'} <= set(names)
  assert not [n for n in names if n.startswith('launcher.rank.')]


def test_no_supervisor_module_loads_jax():
  code = ('import importlib, sys\n'
          f'for name in {supervisor_modules()!r}:\n'
          '  importlib.import_module(name)\n'
          'print(sorted(m for m in sys.modules\n'
          '             if m == "jax" or m.startswith(("jax.", "jaxlib"))))\n')
  result = subprocess.run([sys.executable, '-c', code], cwd=helpers.REPO,
                          capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == '[]', result.stdout
