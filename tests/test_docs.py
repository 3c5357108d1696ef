"""The docs hold together: the site builds with every link and anchor
found, the README stays one screen of reasons and a few of commands, and
its links reach pages and headings that exist."""

import os
import pathlib
import re
import subprocess
import sys

from markdown.extensions import toc
import pytest

from tests import helpers

pytestmark = pytest.mark.unit

README = helpers.REPO / 'README.md'
DOCS = helpers.REPO / 'docs'


def test_the_site_builds_strictly(tmp_path):
  """About 3 s: MkDocs builds every page; a broken link, a missing anchor
  or a page left out of the navigation fails it (mkdocs.yml)."""
  result = subprocess.run([
      sys.executable, '-m', 'mkdocs', 'build', '--strict', '--quiet',
      '--site-dir',
      str(tmp_path / 'site')
  ],
                          cwd=helpers.REPO,
                          capture_output=True,
                          text=True,
                          timeout=120,
                          env={
                              **os.environ, 'NO_MKDOCS_2_WARNING': '1'
                          })
  assert result.returncode == 0, result.stdout + result.stderr
  assert (tmp_path / 'site' / 'deployments' / 'cloud-tpu' /
          'index.html').exists()


def test_the_reference_pages_are_what_the_code_says():
  """The flags and config pages (scripts/docs_reference.py) match the
  flags and runtime/config_base.py as they are now."""
  result = subprocess.run(
      [sys.executable, 'scripts/docs_reference.py', '--check'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=120,
      env=helpers.launcher_env())
  assert result.returncode == 0, result.stderr


def test_every_config_field_is_described_at_its_definition():
  # The config page's rows come from the comment right above each field in
  # runtime/config_base.py (the test above keeps the page current).
  rows = [
      line.split('|')
      for line in (DOCS / 'reference' / 'config.md').read_text().splitlines()
      if line.startswith('| `')
  ]
  assert len(rows) >= 40
  undescribed = [r[1].strip() for r in rows if not r[3].strip()]
  assert not undescribed, f'no comment above: {undescribed}'


def test_the_readme_is_one_screen_of_why_and_limits():
  lines = README.read_text().splitlines()
  assert len(lines) <= 200, f'README.md is {len(lines)} lines: 200 at most'
  # As read: the quote's markers and the line breaks gone.
  first_screen = ' '.join(re.sub(r'^> ?', '', l) for l in lines[:40])
  for said in ('Status and limits', 'Data parallelism only',
               'On real hardware: one TPU v5e chip only',
               'Never yet on a multi-host TPU slice or on a GPU'):
    assert said in first_screen, said


def _anchors(page: pathlib.Path) -> set[str]:
  """The ids MkDocs gives the page's headings (outside code blocks)."""
  text = re.sub(r'```.*?```', '', page.read_text(), flags=re.S)
  return {
      toc.slugify(re.sub(r'[`*]', '', h), '-')
      for h in re.findall(r'^#+ (.+)$', text, re.M)
  }


def test_every_link_of_the_readme_reaches_a_page_and_heading():
  links = re.findall(r'\]\(([^)]+)\)', README.read_text())
  local = [l for l in links if not l.startswith(('http://', 'https://'))]
  assert local, 'the README links to the docs'
  for link in local:
    path, _, anchor = link.partition('#')
    page = helpers.REPO / path
    assert page.exists(), f'README links to {path}, which does not exist'
    if anchor:
      assert anchor in _anchors(page), (
          f'README links to {link}: {path} has no heading {anchor!r}; '
          f'it has {sorted(_anchors(page))}')


def test_the_newest_changelog_heading_is_pyprojects_version_and_a_date():
  import tomllib  # pylint: disable=g-import-not-at-top
  version = tomllib.loads(
      (helpers.REPO / 'pyproject.toml').read_text())['project']['version']
  headings = re.findall(r'^## (\S+) \((\d{4}-\d{2}-\d{2})\)$',
                        (helpers.REPO / 'CHANGELOG.md').read_text(), re.M)
  assert headings and headings[0][0] == version, (headings[:1], version)


def _fields(config, prefix='') -> set[str]:
  names = set()
  for key, value in config.items():
    names.add(prefix + key)
    if hasattr(value, 'items'):
      names |= _fields(value, prefix + key + '.')
  return names


def test_every_config_override_a_page_names_is_a_field():
  """A `--config.NAME=...` in the README or a page names a field of a
  config the project ships (configs/*.py, or the tests' probe workload's
  that docs/tests.md describes): a renamed field leaves no recipe that
  fails with an unknown key."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  from runtime import config_base  # pylint: disable=g-import-not-at-top
  fields = set(_fields(config_base.get_config()))
  for path in [
      *sorted((helpers.REPO / 'configs').glob('*.py')),
      helpers.REPO / 'tests' / 'workloads' / 'probe_config.py'
  ]:
    if path.name == 'base.py':  # Deprecated for runtime/config_base.py.
      continue
    spec = importlib.util.spec_from_file_location(f'_page_{path.stem}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fields |= _fields(module.get_config())
  unknown = []
  for page in [README, *sorted(DOCS.rglob('*.md'))]:
    for number, line in enumerate(page.read_text().splitlines(), 1):
      for name in re.findall(r'--config\.([a-z_][a-z_0-9.]*[a-z0-9_])', line):
        if name not in fields:
          unknown.append(f'{page.relative_to(helpers.REPO)}:{number} '
                         f'--config.{name}')
  assert not unknown, unknown


def _tables_broken_by_a_blank_line(text: str) -> list[int]:
  """Line numbers (from 1) of table rows that follow a blank line which
  follows a table row: Markdown ends the table at the blank line, and the
  rows after it render as a paragraph of `|`s (mkdocs --strict passes)."""
  lines = text.splitlines()
  found, in_code = [], False
  for i, line in enumerate(lines):
    if line.lstrip().startswith('```'):
      in_code = not in_code
    if in_code or i < 2:
      continue
    if (line.startswith('|') and not lines[i - 1].strip() and
        lines[i - 2].startswith('|')):
      found.append(i + 1)
  return found


def test_no_table_is_broken_by_a_blank_line():
  assert _tables_broken_by_a_blank_line('| a |\n| --- |\n| 1 |\n\n| 2 |\n') == [
      5
  ]
  assert _tables_broken_by_a_blank_line('| a |\n| --- |\n\ntext\n| b |') == []
  broken = {
      str(page.relative_to(helpers.REPO)):
          _tables_broken_by_a_blank_line(page.read_text()) for page in
      [helpers.REPO / 'README.md', *(helpers.REPO / 'docs').rglob('*.md')]
  }
  assert {p: lines for p, lines in broken.items() if lines} == {}


def test_every_hand_off_variable_is_in_the_environment_table():
  from runtime.common import goodput  # pylint: disable=g-import-not-at-top
  from runtime.common import handoff  # pylint: disable=g-import-not-at-top
  page = (helpers.REPO / 'docs' / 'reference' / 'environment.md').read_text()
  named = set(re.findall(r'^\| `(\w+)` \|', page, re.M))
  told = {*handoff.NAMES, goodput.EXEC_VARIABLE}
  told |= {
      getattr(handoff, n)
      for n in dir(handoff)
      if n.isupper() and isinstance(getattr(handoff, n), str) and
      getattr(handoff, n).startswith('PODRUN_')
  }
  assert told - named == set()
