"""`podrun --help`: every flag of the launcher, grouped, one line each."""

from absl import flags
import pytest

from launcher import cli
from launcher import cli_flags
from launcher import usage

pytestmark = pytest.mark.unit


def test_every_launcher_flag_is_in_exactly_one_group():
  defined = {
      f.name for f in flags.FLAGS.get_flags_for_module(cli_flags.__name__)
  }
  grouped = [name for _, entries in usage.groups() for name, _ in entries]
  assert sorted(grouped) == sorted(defined)
  with pytest.raises(ValueError, match='already in'):
    usage.declare(flags.FLAGS['workdir'], usage.WHAT, 'twice')


def test_help_lists_each_flag_on_one_line_and_exits_0(capsys):
  with pytest.raises(SystemExit) as exited:
    cli.parse_flags(['podrun', '--help'])
  assert exited.value.code == 0
  shown = capsys.readouterr().out
  for _, entries in usage.groups():
    for name, summary in entries:
      line = [
          l for l in shown.splitlines()
          if f'--{name} ' in l or f'--[no]{name} ' in l
      ]
      assert len(line) == 1 and summary in line[0], name
  assert '--stall_timeout                ceiling, in seconds, between two ' \
         'steps (default 600.0)' in shown
  assert 'debugger' not in shown  # absl's own flags stay in --helpfull.
