"""The restart policy: what is retried, how it is counted, how long it waits."""

import os
import signal
import threading
import time

import pytest

from launcher import agent
from launcher import attempts
from launcher import restart
from launcher.ray import __main__ as ray_main
from launcher.tpu import flags as tpu_flags
from runtime.common import exit_codes
from tests import helpers

pytestmark = pytest.mark.unit


def _run(start, restarts, logs_dir, **fields):
  """The job agent over attempts that `start(number)` makes."""
  return agent.run(
      agent.Job(start=lambda begun: start(begun.number),
                restarts=restarts,
                logs_dir=str(logs_dir),
                **fields))


def test_preemption_is_always_retryable_and_user_errors_never():
  assert restart.kind_of(exit_codes.PREEMPTED, ()) == 'preempted'
  assert restart.kind_of(0, ()) == 'ok'
  assert restart.kind_of(137, (137,)) == 'retryable'
  assert restart.kind_of(137, ()) == 'final'
  for code in (exit_codes.FAILED, exit_codes.CONFIG_ERROR,
               exit_codes.TOPOLOGY_MISMATCH, exit_codes.CHECKPOINT_ERROR):
    assert restart.kind_of(code, (code,)) == 'final'


def test_check_retryable_refuses_user_error_codes():
  assert restart.check_retryable(['137', 124, 137]) == (124, 137)
  with pytest.raises(ValueError,
                     match=r'exit code\(s\) \[2, 5\] cannot be '
                     'retried'):
    restart.check_retryable([2, 5, 124])


def test_one_supervision_spec_for_every_launcher():
  """The local pod, a TPU launch and a Ray job read their restart flags
  into the same frozen spec, checked as it is made."""
  assert restart.RestartPolicy(2, 0.5, (137, 7, 137)).retryable == (7, 137)
  with pytest.raises(ValueError, match=r'exit code\(s\) \[2\] cannot'):
    restart.RestartPolicy(retryable=(2,))
  with pytest.raises(ValueError, match='--max_restarts=-1'):
    restart.RestartPolicy(max_restarts=-1)
  tpu, _ = tpu_flags.parse(
      ['--tpu=t', '--zone=z', '--max_restarts=3', '--retry_exit_codes=137,7'],
      ['--config=c'])
  ray = ray_main.parse([
      '--num_processes=2', '--max_restarts=3', '--retry_exit_codes=137,7', '--',
      '--config=c', '--workdir=/w'
  ])
  assert tpu.restarts == ray.restarts == restart.RestartPolicy(3, 1.0, (7, 137))


def test_backoff_doubles_up_to_a_minute():
  assert [restart.backoff_s(1.0, n) for n in (1, 2, 3, 4, 5)] == [0, 1, 2, 4, 8]
  assert restart.backoff_s(1.0, 30) == restart.MAX_BACKOFF_S


class _FakePod:
  """An attempts.Attempt that ends as it is told."""

  def __init__(self, code, signalled=False, progressed=False):
    self.end = attempts.AttemptEnd(code,
                                   launcher_signalled=signalled,
                                   progressed=progressed)

  def run(self) -> attempts.AttemptEnd:
    return self.end


def test_run_counts_preemptions_and_failures_apart(tmp_path, capsys):
  codes = iter([exit_codes.PREEMPTED, 137, exit_codes.PREEMPTED, 0])
  code = _run(lambda attempt: _FakePod(next(codes)),
              restart.RestartPolicy(5, 0, (137,)),
              logs_dir=str(tmp_path))
  assert code == 0
  assert ('after 3 restart(s): 2 preemption(s), 1 retryable failure(s)'
          in capsys.readouterr().err)
  assert len((tmp_path / 'attempts.jsonl').read_text().splitlines()) == 4


def test_run_stops_when_restarts_are_used_up(tmp_path, capsys):
  code = _run(lambda attempt: _FakePod(exit_codes.PREEMPTED),
              restart.RestartPolicy(2, 0, ()),
              logs_dir=str(tmp_path))
  assert code == exit_codes.PREEMPTED
  err = capsys.readouterr().err
  assert 'not restarting: --max_restarts=2 used up' in err
  assert 'after 2 restart(s): 3 preemption(s)' in err


def test_a_signalled_launcher_is_not_restarted(tmp_path):
  pods = []

  def start(attempt):
    pods.append(attempt)
    return _FakePod(exit_codes.PREEMPTED, signalled=True)

  assert _run(start, restart.RestartPolicy(3, 0, ()),
              logs_dir=str(tmp_path)) == exit_codes.PREEMPTED
  assert pods == [1]


def test_only_failures_without_progress_back_off(tmp_path, monkeypatch):
  waits = []
  monkeypatch.setattr(agent, '_sleep_unless_signalled',
                      lambda s: waits.append(s) or None)  # No signal.
  progressed = iter([True, False, False, True, False])

  def start(attempt):
    return _FakePod(137 if attempt < 6 else 0,
                    progressed=next(progressed, True))

  assert _run(start,
              restart.RestartPolicy(5, 1.0, (137,)),
              logs_dir=str(tmp_path)) == 0
  # Trained then failed: at once; then 1 s, 2 s while failing without a
  # step; at once after an attempt that trained, and 1 s after one more
  # that did not.
  assert waits == [0, 1, 2, 0, 1]


def test_a_signal_during_the_back_off_ends_the_run_with_128_plus_n(
    tmp_path, capsys):
  started, told = [], []
  before = signal.getsignal(signal.SIGTERM)

  def term_once_the_back_off_handles_it():
    # Not at a fixed delay: before the back-off's handler is in, SIGTERM
    # would meet another (or the default, which ends this process).
    if helpers.wait_for(lambda: signal.getsignal(signal.SIGTERM) != before, 20,
                        0.01):
      os.kill(os.getpid(), signal.SIGTERM)

  def start(attempt):
    started.append(attempt)
    if attempt == 1:  # SIGTERM arrives while the launcher waits 30 s.
      threading.Thread(target=term_once_the_back_off_handles_it,
                       daemon=True).start()
    return _FakePod(137)

  began = time.monotonic()
  code = _run(start,
              restart.RestartPolicy(3, 30, (137,)),
              logs_dir=str(tmp_path),
              on_signal=told.append)
  assert code == 128 + signal.SIGTERM and told == [signal.SIGTERM]
  assert started == [1]  # Not restarted.
  assert time.monotonic() - began < 25  # Generous: the back-off was 30 s.
  assert 'got SIGTERM while waiting to restart' in capsys.readouterr().err


def test_a_signal_the_caller_already_got_is_not_slept_through(tmp_path):
  code = _run(lambda attempt: _FakePod(137),
              restart.RestartPolicy(3, 30, (137,)),
              logs_dir=str(tmp_path),
              pending_signal=lambda: signal.SIGINT)
  assert code == 128 + signal.SIGINT


def test_an_exit_code_not_retried_says_which_are(tmp_path, capsys):
  # --max_restarts alone after a SIGKILL: the job ends, and says why.
  code = _run(lambda attempt: _FakePod(137),
              restart.RestartPolicy(2, 0, ()),
              logs_dir=str(tmp_path))
  assert code == 137
  assert ('not restarting: exit code 137 (SIGKILL) is not retried; '
          '--max_restarts=2 restarts after a preemption (75) and the codes '
          'of --retry_exit_codes (none): add --retry_exit_codes=137 to '
          'restart after it') in capsys.readouterr().err
  _run(lambda attempt: _FakePod(exit_codes.CONFIG_ERROR),
       restart.RestartPolicy(2, 0, (137,)),
       logs_dir=str(tmp_path / 'config'))
  assert 'exit code 2 (' in capsys.readouterr().err
