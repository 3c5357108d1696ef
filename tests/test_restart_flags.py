"""--max_restarts, --restart_backoff and --retry_exit_codes are declared once
(launcher/restart_flags.py) and read the same way by all three launchers."""

import re

import pytest

from launcher import restart
from launcher import restart_flags
from launcher.ray import __main__ as ray_main
from launcher.tpu import flags as tpu_flags
from tests import helpers

pytestmark = pytest.mark.unit

_JOB = ['--', '--config=configs/mnist.py', '--workdir=/shared/mnist']


def _ray(*own):
  return ray_main.parse(['--num_processes=2', *own, *_JOB]).restarts


def _tpu(*own):
  options, _ = tpu_flags.parse(['--tpu=t', '--zone=z', *own], _JOB[1:])
  return options.restarts


def test_both_argparse_launchers_read_them_into_one_supervision():
  own = ('--max_restarts=3', '--restart_backoff=2.5',
         '--retry_exit_codes=137, 124')
  expected = restart.RestartPolicy(3, 2.5, (124, 137))
  assert _ray(*own) == _tpu(*own) == expected
  assert _ray() == _tpu() == restart.RestartPolicy()


@pytest.mark.parametrize('own, words', [
    (('--retry_exit_codes=137,x',), "'x' is not an exit code"),
    (('--retry_exit_codes=2',), r'exit code\(s\) \[2\] cannot be retried'),
    (('--max_restarts=-1',), 'neither may be negative'),
])
def test_a_bad_value_is_refused_in_the_same_words_by_each(own, words, capsys):
  for parse in (_ray, _tpu):
    with pytest.raises(SystemExit):
      parse(*own)
    err = capsys.readouterr().err
    assert ('--max_restarts, --restart_backoff, --retry_exit_codes: ' in err and
            re.search(words, err)), err


def test_podrun_declares_them_from_the_same_place():
  from absl import flags  # pylint: disable=g-import-not-at-top
  from launcher import cli  # pylint: disable=g-import-not-at-top,unused-import
  for name, _, default, text in restart_flags.FLAGS:
    assert flags.FLAGS[name].default == default
    assert flags.FLAGS[name].help == 'Local pod: ' + text


def test_no_other_module_declares_them():
  declared = []
  for path in sorted((helpers.REPO / 'launcher').rglob('*.py')):
    if path.name == 'restart_flags.py':
      continue
    text = path.read_text()
    declared += [
        f'{path.relative_to(helpers.REPO)}: {name}'
        for name, *_ in restart_flags.FLAGS
        if re.search(
            rf"(add_argument|add)\(\s*'--{name}'|"
            rf"DEFINE_\w+\(\s*'{name}'", text)
    ]
  assert not declared, declared
  # The check finds both spellings.
  assert re.search(r"DEFINE_\w+\(\s*'max_restarts'",
                   "flags.DEFINE_integer(\n    'max_restarts', 0, 'x')")
