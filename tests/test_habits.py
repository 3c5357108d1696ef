"""The habits .ci/run holds: the formatter's and the type checker's
settings, and the list of modules the type checker still passes over."""

import ast
import tomllib

import pytest

from tests import helpers

pytestmark = pytest.mark.unit


def _pyproject() -> dict:
  return tomllib.loads((helpers.REPO / 'pyproject.toml').read_text())


def test_the_type_checker_passes_over_no_module():
  mypy = _pyproject()['tool']['mypy']
  assert mypy['files'] == ['launcher', 'runtime']
  skipped = [
      o['module'] for o in mypy.get('overrides', []) if o.get('ignore_errors')
  ]
  assert not skipped, (f'modules whose errors the type checker ignores: '
                       f'{skipped}; fix their errors instead')


def test_the_formatter_and_the_checker_are_pinned_in_the_test_extra():
  test_extra = _pyproject()['project']['optional-dependencies']['test']
  assert 'yapf==0.43.0' in test_extra and 'mypy==2.4.1' in test_extra
  assert _pyproject()['tool']['yapf']['indent_width'] == 2


# Where runtime/ may read a config's fields: the typed views (the options),
# the config's own module, the read-check, and the built-in workloads, which
# are users' code (Flax's examples' `train_and_evaluate(config, workdir)`).
CONFIG_READERS = ('runtime/options.py', 'runtime/checkpoints/options.py',
                  'runtime/parallelism/options.py', 'runtime/config_base.py',
                  'runtime/config_reads.py', 'runtime/workloads/')


def _config_reads(path) -> list[str]:
  """'line: config.NAME' for every attribute of a name `config` in `path`."""
  tree = ast.parse(path.read_text())
  return [
      f'{node.lineno}: config.{node.attr}' for node in ast.walk(tree)
      if isinstance(node, ast.Attribute) and
      isinstance(node.value, ast.Name) and node.value.id == 'config'
  ]


def test_the_runtime_reads_the_config_only_through_its_options():
  found = {}
  for path in sorted((helpers.REPO / 'runtime').rglob('*.py')):
    rel = path.relative_to(helpers.REPO).as_posix()
    if not rel.startswith(CONFIG_READERS):
      found.update({f'{rel}:{read}': None for read in _config_reads(path)})
  assert not found, (
      'runtime/ reads config fields outside the options (add the field to '
      f'TrainOptions or a part\'s options and pass the value): {list(found)}')


def test_the_oldest_pins_are_the_floors_pyproject_allows():
  """scripts/oldest.txt is what CI's oldest pair installs: each pin must be
  the lower bound pyproject.toml states, or the floor is untested."""
  import re  # pylint: disable=g-import-not-at-top
  floors = {}
  for requirement in _pyproject()['project']['dependencies']:
    found = re.match(r'([A-Za-z0-9_.-]+)(?:\[[^]]*\])?>=([0-9.]+)', requirement)
    if found:
      floors[found.group(1).lower()] = found.group(2)
  pins = {}
  for line in (helpers.REPO / 'scripts' /
               'oldest.txt').read_text().splitlines():
    if '==' in line and not line.startswith('#'):
      name, version = line.split('==')
      pins[name.strip().lower()] = version.strip()
  assert {'jax', 'optax', 'orbax-checkpoint', 'flax'} <= set(pins) & set(floors)
  differ = {
      name: (floors[name], pin)
      for name, pin in pins.items()
      if name in floors and floors[name] != pin
  }
  assert not differ, (f'pyproject.toml floor against scripts/oldest.txt pin: '
                      f'{differ}; make them one')
