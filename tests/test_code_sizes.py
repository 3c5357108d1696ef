"""scripts/code_sizes.py: sizes and import circles, and none in the project."""

import importlib.util

import pytest

from tests import helpers

pytestmark = pytest.mark.unit


def _code_sizes():
  spec = importlib.util.spec_from_file_location(
      'code_sizes', helpers.REPO / 'scripts' / 'code_sizes.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_circles_finds_each_cycle_once():
  circles = _code_sizes().circles
  assert circles({
      'a': {'b'},
      'b': {'c'},
      'c': {'a'},
      'd': {'a'}
  }) == [['a', 'b', 'c']]
  assert circles({'a': {'b'}, 'b': set()}) == []


def test_the_project_has_no_import_circle():
  module = _code_sizes()
  module_sizes, _, _, graph = module.measure(str(helpers.REPO))
  assert module.circles(graph) == []
  assert 'launcher.tpu.driver' in graph
  assert {name for _, name in module_sizes} == set(graph)


def test_house_counts_what_it_names(tmp_path):
  sources = {
      'runtime/__init__.py':
          '',
      'runtime/loop.py': ('_n = 0\ndef bump(config, rank):\n'
                          '  global _n\n  _n += rank\n'),
      'runtime/common/__init__.py':
          '',
      'runtime/common/stall.py':
          ('import os\ndef path(workdir, i):\n'
           '  return os.path.join(workdir, "stall", f"rank_{i}.json")\n'),
      'launcher/__init__.py':
          '',
      'launcher/restart.py': ('def code(attempt, process_index):\n'
                              '  return getattr(attempt, "code", None)\n'),
      'launcher/cli.py': ('def path(workdir):\n'
                          '  return f"{workdir}/summary.json"\n'),
  }
  for name, text in sources.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
  figures = _code_sizes().house(str(tmp_path))
  assert figures == dict(globals=1,
                         config_functions=1,
                         config_modules=1,
                         attempt_getattrs=1,
                         path_spellers=['launcher.cli', 'runtime.common.stall'],
                         runtime_root=2,
                         process_index=1,
                         rank=2,
                         process_id=0)


def test_the_project_asks_its_layout_for_every_workdir_path():
  """What issue 38 brought down stays down: one module spells the
  workdir's paths, and the restart loop reads an attempt's end, not its
  fields."""
  figures = _code_sizes().house(str(helpers.REPO))
  assert figures['path_spellers'] == []
  assert figures['attempt_getattrs'] == 0
  assert figures['rank'] == 0
