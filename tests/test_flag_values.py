"""launcher/common/flag_values.py reads a flag as absl itself does."""

from absl import flags
import pytest

from launcher.common import flag_values

pytestmark = pytest.mark.unit


def _absl_workdir(args: list[str]):
  """What absl gives --workdir for `args` (None: not given)."""
  values = flags.FlagValues()
  flags.DEFINE_string('workdir', None, '', flag_values=values)
  flags.DEFINE_string('config', None, '', flag_values=values)
  values(['prog', *args], known_only=True)
  return values.workdir


@pytest.mark.parametrize('args', [
    [],
    ['--config=c.py'],
    ['--workdir=a'],
    ['--workdir', 'a'],
    ['-workdir=a'],
    ['-workdir', 'a'],
    ['--workdir=a', '--workdir=b'],
    ['--workdir=a', '--workdir', 'b'],
    ['--workdir', 'a', '--workdir=b', '--config=c.py'],
    ['--workdir=gs://bucket/run=1'],
    ['--workdir='],
    ['--workdir=a', '--', '--workdir=b'],
])
def test_the_last_value_wins_in_either_spelling_as_absl_reads_it(args):
  assert flag_values.workdir_of(args) == _absl_workdir(args)


def test_a_flag_whose_name_only_starts_the_same_is_another_flag():
  assert flag_values.workdir_of(['--workdir_suffix=x']) is None
  assert flag_values.last_value(['--config.steps=3'], 'config') is None
