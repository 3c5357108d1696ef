"""Writes the docs' reference pages from the code, or checks them.

- docs/reference/flags.md: `podrun`'s flags (launcher/usage.py's groups,
  declared beside each flag in launcher/cli.py, each flag's default and
  absl help), `podrun-tpu launch`'s
  (launcher/tpu/flags.py) and `podrun-ray`'s (launcher/ray/__main__.py),
  by their argparse groups;
- docs/reference/config.md: every field of runtime/config_base.py, by section,
  with its default and the comment above it;
- docs/changelog.md: CHANGELOG.md, for the site.

  python scripts/docs_reference.py           # writes the pages
  python scripts/docs_reference.py --check   # exit 1, naming the stale ones

tests/test_docs.py runs --check, so a flag or a field changed without its
page fails the suite.
"""

import argparse
import ast
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from runtime import config_base  # pylint: disable=g-import-not-at-top,wrong-import-position
from launcher import cli  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
from launcher import usage  # pylint: disable=g-import-not-at-top,wrong-import-position
from launcher.ray import __main__ as ray_main  # pylint: disable=g-import-not-at-top,wrong-import-position
from launcher.tpu import flags as tpu_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

PAGES = {
    'flags': REPO / 'docs' / 'reference' / 'flags.md',
    'config': REPO / 'docs' / 'reference' / 'config.md',
    'changelog': REPO / 'docs' / 'changelog.md'
}
_GENERATED = ('<!-- Written by scripts/docs_reference.py from the code: edit '
              'the code, then run it. -->')


def _cell(text) -> str:
  """One table cell: no line breaks, no bar that would end it."""
  return ' '.join(str(text).split()).replace('|', '\\|')


def _default(value) -> str:
  if value is None or value == '':
    return ''
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (list, tuple)):
    return _cell(','.join(map(str, value))) if value else ''
  return f'`{_cell(value)}`'


def _podrun() -> list[str]:
  out = [
      '## podrun', '',
      '`podrun --config=FILE [flags]`, the same as `python -m launcher`. '
      '`--config.FIELD=VALUE` overrides any field of the config '
      '([Config fields](config.md)).', ''
  ]
  for title, entries in usage.groups():
    out += [
        f'### {title}', '', '| flag | default | what |', '| --- | --- | --- |'
    ]
    for name, _ in entries:
      flag = flags.FLAGS[name]
      out.append(f'| `--{name}` | {_default(flag.default)} | '
                 f'{_cell(flag.help)} |')
    out.append('')
  return out


def _argparse(title: str, intro: str,
              parser: argparse.ArgumentParser) -> list[str]:
  out = [f'## {title}', '', intro, '']
  for group in parser._action_groups:  # pylint: disable=protected-access
    actions = [
        a for a in group._group_actions  # pylint: disable=protected-access
        if a.option_strings and a.dest != 'help'
    ]
    if not actions:
      continue
    heading = 'Flags' if group.title in ('options', 'optional arguments') \
        else group.title
    out += [
        f'### {heading}', '', '| flag | default | what |', '| --- | --- | --- |'
    ]
    for action in actions:
      name = max(action.option_strings, key=len)
      default = (
          '(required)' if action.required else '' if action.default
          is argparse.SUPPRESS or isinstance(action, argparse._StoreTrueAction)  # pylint: disable=protected-access
          else _default(action.default))
      out.append(f'| `{name}` | {default} | {_cell(action.help or "")} |')
    out.append('')
  return out


def flags_page() -> str:
  lines = [
      '# Flags',
      '',
      _GENERATED,
      '',
      'Every flag of the three commands, by what it is for. '
      '`podrun --help`, `podrun-tpu launch --help` and '
      '`podrun-ray --help` list the same flags, each with a shorter '
      'text.',
      '',
      *_podrun(),
      *_argparse(
          'podrun-tpu launch',
          '`scripts/launch_tpu_pod.sh --tpu=NAME --zone=ZONE '
          '[flags] -- <podrun flags>`, the same as '
          '`podrun-tpu launch ...`.', tpu_flags._parser()),  # pylint: disable=protected-access
      *_argparse('podrun-ray',
                 '`podrun-ray --num_processes=N [flags] -- <podrun '
                 'flags>`.', ray_main._parser())
  ]  # pylint: disable=protected-access
  return '\n'.join(lines).rstrip() + '\n'


def _field_name(target: ast.expr) -> str:
  """'data.shuffle' for `config.data.shuffle`."""
  parts = []
  while isinstance(target, ast.Attribute):
    parts.append(target.attr)
    target = target.value
  return '.'.join(reversed(parts))


def _comment_above(lines: list[str], lineno: int) -> str:
  """The `#` lines right above line `lineno` (1-based), joined."""
  found, at = [], lineno - 2
  while at >= 0 and lines[at].strip().startswith('#'):
    found.append(lines[at].strip()[1:].strip())
    at -= 1
  return ' '.join(reversed(found))


def config_page() -> str:
  path = REPO / 'runtime' / 'config_base.py'
  source = path.read_text()
  lines = source.splitlines()
  values = config_base.get_config()
  out = [
      '# Config fields', '', _GENERATED, '',
      'Every field of `runtime/config_base.py`, which every config starts from; '
      '`--config.FIELD=VALUE` sets one on the command line. The fields of '
      '`model`, `optimizer` and `data`, with `workload`, `seed` and '
      '`global_batch_size`, decide what a run computes: a resumed run '
      'must agree with its checkpoint on them.', ''
  ]
  for node in ast.parse(source).body:
    if not (isinstance(node, ast.FunctionDef) and node.name.startswith('_add')):
      continue
    out += [
        f'## {ast.get_docstring(node).rstrip(".")}', '',
        '| field | default | what |', '| --- | --- | --- |'
    ]
    for statement in node.body:
      if not (isinstance(statement, ast.Assign) and
              isinstance(statement.targets[0], ast.Attribute)):
        continue
      name = _field_name(statement.targets[0])
      value = values
      for part in name.split('.'):
        value = value[part]
      if hasattr(value, 'keys'):
        continue  # A section; its fields follow.
      out.append(f'| `{name}` | {_default(value)} | '
                 f'{_cell(_comment_above(lines, statement.lineno))} |')
    out.append('')
  return '\n'.join(out).rstrip() + '\n'


def changelog_page() -> str:
  """CHANGELOG.md as the site's page, its links made the site's."""
  text = (REPO / 'CHANGELOG.md').read_text()
  return f'{_GENERATED}\n\n' + text.replace('](docs/', '](')


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--check',
                      action='store_true',
                      help='change nothing; exit 1 naming a stale page')
  args = parser.parse_args(argv)
  stale = []
  for name, text in (('flags', flags_page()), ('config', config_page()),
                     ('changelog', changelog_page())):
    page = PAGES[name]
    if page.exists() and page.read_text() == text:
      continue
    if args.check:
      stale.append(os.path.relpath(page, REPO))
    else:
      page.write_text(text)
      print(f'wrote {os.path.relpath(page, REPO)}')
  if stale:
    print(f'stale: {", ".join(stale)}; run python scripts/docs_reference.py',
          file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
