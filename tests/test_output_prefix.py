import io
import logging as std_logging

import pytest

from launcher import cli
from launcher.common import output_prefix

pytestmark = pytest.mark.unit


def test_prefixed_stream_prefixes_every_line_once():
  out = io.StringIO()
  stream = output_prefix.PrefixedStream(out, '[rank 1/4] ')
  stream.write('a\nb')
  stream.write('c\n\nd\n')
  assert out.getvalue(
  ) == '[rank 1/4] a\n[rank 1/4] bc\n[rank 1/4] \n[rank 1/4] d\n'


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


def test_a_platform_jax_does_not_have_stays_in_the_logs():
  # JAX 0.10-0.12 log it at INFO when the tpu plugin finds no TPU.
  line = ("I1202 10:00:00.123456 140000 xla_bridge.py:858] Unable to "
          "initialize backend 'tpu': INTERNAL: Failed to open libtpu.so")
  assert output_prefix.routine(line)
  assert output_prefix.routine('[rank 0/4] ' + line)
  assert not output_prefix.shown_on_console(0, 'stderr', line, False)
  assert output_prefix.shown_on_console(0, 'stderr', line, True)
  # A warning or an error that names a backend still shows.
  warning = 'W' + line[1:]
  assert not output_prefix.routine(warning)
  assert output_prefix.shown_on_console(0, 'stderr', warning, False)


def test_routine_library_logs_are_kept_off(monkeypatch):
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', 'http://127.0.0.1:4443')
  output_prefix.quiet_routine_logs()
  seen = []

  class Keep(std_logging.Handler):

    def emit(self, record):
      seen.append((record.name, record.getMessage()))

  handler = Keep()
  loggers = [
      std_logging.getLogger(n)
      for n in ('jax._src.xla_bridge', 'google.auth._default',
                'google.auth.compute_engine._metadata')
  ]
  for logger in loggers:
    logger.addHandler(handler)
  try:
    jax_log, auth, metadata = loggers
    jax_log.info("Unable to initialize backend 'tpu': no libtpu.so")
    jax_log.warning('a real warning of JAX')
    auth.warning('Authentication failed using Compute Engine authentication')
    metadata.warning('Compute Engine Metadata server unavailable')
    auth.error('an error is still shown')
  finally:
    for logger in loggers:
      logger.removeHandler(handler)
  assert [m for _, m in seen
         ] == ['a real warning of JAX', 'an error is still shown']
  credentials = ('E1202 23:15:05.530524   14210 google_auth_provider.cc:188] '
                 'Could not find the credentials file in the standard gcloud '
                 'location')
  assert output_prefix.routine('[rank 0/2] ' + credentials)
  monkeypatch.delenv('STORAGE_EMULATOR_HOST')
  assert not output_prefix.routine(credentials)  # A real bucket: shown.


def test_interleaved_gloo_lines_stay_in_the_logs():
  # Two threads' writes, as a 2x4 pod printed them on a peer restore.
  for line in ('[Gloo] Rank [Gloo] Rank 0 is connected to 7 peer ranks. '
               'Expected number of connected peer ranks is : 7',
               '3 is connected to 7 peer ranks. Expected number of connected '
               'peer ranks is : 7', '[Gloo] Rank ',
               ' peer ranks. Expected number of connected peer ranks is : 7'):
    assert output_prefix.routine('[rank 0/2] ' + line), line
  assert not output_prefix.routine(
      '3 is connected to 5 peer ranks. Expected number of connected peer '
      'ranks is : 7')


def test_pod_passthrough_drops_the_flags_the_pod_sets():
  cli.parse_flags(['launcher', '--config=configs/linear_regression.py'])
  args = [
      '--config=configs/linear_regression.py', '--config.steps=5',
      '--local_processes', '2', '--local_devices=4', '--dry_run', '--workdir',
      '/tmp/x', '--stall_timeout=9', '--nodry_run'
  ]
  assert cli.pod_passthrough_args(args) == [
      '--config=configs/linear_regression.py', '--config.steps=5',
      '--stall_timeout=9'
  ]
