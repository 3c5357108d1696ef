"""launcher/common/flag_values.py reads a flag as absl itself does."""

from absl import flags
import pytest

from launcher.common import flag_values
from tests import helpers

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
  assert flag_values.LaunchArgs(args).workdir == _absl_workdir(args)


def test_a_flag_whose_name_only_starts_the_same_is_another_flag():
  assert flag_values.LaunchArgs(['--workdir_suffix=x']).workdir is None
  assert flag_values.last_value(['--config.steps=3'], 'config') is None


def test_launch_args_split_once_and_read_as_absl_does():
  own, args = flag_values.LaunchArgs.split([
      '--num_processes=4', '--', '--config=c.py:small', '--tls', 'require',
      '--workdir=a', '--config.topology.accelerator_type=v5e-8', '--workdir',
      'gs://b/r'
  ])
  assert own == ['--num_processes=4']
  assert (args.workdir, args.config, args.tls) == ('gs://b/r', 'c.py:small',
                                                   'require')
  assert args.value('config.topology.accelerator_type') == 'v5e-8'
  # The words themselves, for the command line.
  assert list(args.with_workdir('w'))[-1] == '--workdir=w'
  assert args.with_workdir('w').workdir == 'w'
  assert flag_values.LaunchArgs.split(['--x']) == (['--x'], ())
  assert flag_values.LaunchArgs().tls == 'auto'


def test_no_driver_reads_the_launchers_flags_but_through_launch_args():
  """Each driver holds one LaunchArgs; what it needs of the launcher's
  flags it asks that, not the words."""
  found = []
  for path in sorted((helpers.REPO / 'launcher').rglob('*.py')):
    if path.name in ('flag_values.py', 'worker.py'):
      continue
    text = path.read_text()
    for needle in ('workdir_of', 'split_launcher_args', 'mode_of(',
                   "startswith('--config", 'last_value('):
      if needle in text:
        found.append(f'{path.relative_to(helpers.REPO)}: {needle}')
  assert not found, found
