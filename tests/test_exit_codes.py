"""One table of exit codes: errors carry theirs, copies agree with it."""

import importlib
import pkgutil
import re
import signal

import pytest

import launcher
from launcher import restart
from launcher.tpu import worker
import runtime
from runtime.common import exit_codes
from tests import helpers

pytestmark = pytest.mark.unit

ExitCode = exit_codes.ExitCode


def _podrun_error_classes() -> list[type]:
  """Every PodrunError subclass defined anywhere in launcher/ and runtime/."""
  for package in (launcher, runtime):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):
      # launcher.exit_codes is the deprecated name of runtime.common's.
      if not info.name.endswith(('__main__', 'launcher.exit_codes')):
        importlib.import_module(info.name)
  found, todo = [], [exit_codes.PodrunError]
  while todo:
    cls = todo.pop()
    found.append(cls)
    todo.extend(cls.__subclasses__())
  return found


def test_every_podrun_error_carries_a_listed_exit_code():
  classes = _podrun_error_classes()
  names = {c.__name__ for c in classes}
  # The errors the old per-process table mapped, and the TPU driver's.
  assert {
      'ConfigError', 'ClusterEnvError', 'BatchSizeError', 'DeviceAxisError',
      'TopologyMismatchError', 'DistributedInitError', 'CheckpointError',
      'IdxError', 'Preempted', 'WorkdirBusyError', 'BarrierTimeout',
      'LaunchError', 'PodUnavailableError', 'PodMismatchError',
      'AcceleratorTypeError'
  } <= names
  for cls in classes:
    assert cls.exit_code in list(ExitCode), cls


@pytest.mark.parametrize('error, code', [
    (SystemExit(3), 3),
    (SystemExit(None), 0),
    (SystemExit('message'), 1),
    (KeyboardInterrupt(), 128 + signal.SIGINT),
    (ValueError('x'), ExitCode.FAILED),
    (exit_codes.ConfigError('x'), ExitCode.CONFIG_ERROR),
    (exit_codes.PodrunError('x', exit_code=42), 42),
])
def test_code_of(error, code):
  assert exit_codes.code_of(error) == code


def test_only_undiagnosed_errors_may_be_consequences():
  assert exit_codes.may_be_consequence(RuntimeError('gloo reset'))
  assert exit_codes.may_be_consequence(SystemExit(7))
  assert not exit_codes.may_be_consequence(exit_codes.ConfigError('x'))
  assert not exit_codes.may_be_consequence(KeyboardInterrupt())


def test_the_module_names_are_the_enum_members():
  assert exit_codes.PREEMPTED is ExitCode.PREEMPTED
  assert set(exit_codes.NEVER_RETRIED) <= set(ExitCode)
  assert set(exit_codes.SAME_EVERYWHERE) <= set(ExitCode)


def test_the_standalone_worker_copies_agree_with_the_enum():
  # launcher/tpu/worker.py imports nothing of the project on purpose.
  assert worker.BUSY == ExitCode.WORKDIR_BUSY
  assert worker.NOT_RUN == ExitCode.CONFIG_ERROR


def test_the_restart_message_names_every_code_never_retried():
  with pytest.raises(ValueError) as e:
    restart.check_retryable([11])
  for code in exit_codes.NEVER_RETRIED:
    assert f'{int(code)}: {code.meaning}' in str(e.value)


def test_the_docs_table_lists_every_code():
  table = (helpers.REPO / 'docs' / 'reference' / 'exit-codes.md').read_text()
  listed = {int(c) for c in re.findall(r'^\| (\d+) \|', table, re.M)}
  assert set(int(c) for c in ExitCode) == listed


def test_signal_suffix():
  assert exit_codes.signal_suffix(137) == ' (SIGKILL)'
  assert exit_codes.signal_suffix(7) == ''


def test_the_root_cause_is_the_first_exit_that_is_not_a_consequence():
  # (when it exited, its code)
  assert exit_codes.root_cause([], 0.0, False) is None
  assert exit_codes.root_cause([(3.0, 10), (3.5, 7)], 4.0, False) == 1
  assert exit_codes.root_cause([(3.5, 7), (3.0, 3)], 4.0, False) == 1
  # Consequences alone wait for the cause, up to the grace or the end.
  assert exit_codes.root_cause([(3.0, 10)], 4.0, False) is None
  assert exit_codes.root_cause([(3.0, 10)],
                               3.0 + exit_codes.CAUSE_GRACE_S + 0.1, False) == 0
  assert exit_codes.root_cause([(3.0, 10), (2.0, 10)], 4.0, True) == 1
