import io

import pytest

from launcher import cli
from runtime.common import output_prefix

pytestmark = pytest.mark.unit


def test_prefixed_stream_prefixes_every_line_once():
  out = io.StringIO()
  stream = output_prefix.PrefixedStream(out, '[rank 1/4] ')
  stream.write('a\nb')
  stream.write('c\n\nd\n')
  assert out.getvalue() == '[rank 1/4] a\n[rank 1/4] bc\n[rank 1/4] \n[rank 1/4] d\n'


def test_console_filter():
  info = 'I1129 19:42:10.4 1 x.py:1] step 5'
  warning = 'W1129 19:42:10.4 1 x.py:1] careful'
  assert output_prefix.shown_on_console(0, 'stdout', 'anything', False)
  assert output_prefix.shown_on_console(0, 'stderr', info, False)
  assert not output_prefix.shown_on_console(1, 'stderr', info, False)
  assert output_prefix.shown_on_console(1, 'stderr', warning, False)
  assert output_prefix.shown_on_console(1, 'stderr', 'Traceback (most', False)
  assert not output_prefix.shown_on_console(1, 'stdout', 'print()', False)
  assert output_prefix.shown_on_console(1, 'stderr', info, True)


def test_gloo_routine_lines_stay_in_the_logs():
  line = ('[Gloo] Rank 2 is connected to 7 peer ranks. Expected number of '
          'connected peer ranks is : 7\n')
  short = line.replace('connected to 7', 'connected to 5')
  assert not output_prefix.shown_on_console(0, 'stderr', line, False)
  assert output_prefix.shown_on_console(0, 'stderr', line, True)
  assert output_prefix.routine('[rank 0/2] ' + line)
  assert not output_prefix.routine(short)
  assert output_prefix.shown_on_console(0, 'stderr', short, False)


def test_pod_passthrough_drops_the_flags_the_pod_sets():
  cli.parse_flags(['launcher', '--config=configs/linear_regression.py'])
  args = ['--config=configs/linear_regression.py', '--config.steps=5',
          '--local_processes', '2', '--local_devices=4', '--dry_run',
          '--workdir', '/tmp/x', '--stall_timeout=9', '--nodry_run']
  assert cli.pod_passthrough_args(args) == [
      '--config=configs/linear_regression.py', '--config.steps=5',
      '--stall_timeout=9']
