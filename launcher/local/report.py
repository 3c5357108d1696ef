"""How a local pod ended, told on the console, and the launcher's exit code.

Example:
  >>> code = report(end, ranks, console, started, logs_dir, signals)
  [launcher] rank 1/2 failed first, with exit code 7, 3.2 s after start. ...
"""

import collections
import signal
import time
from typing import Optional

from launcher.local import members as members_lib
from launcher.local import monitor
from launcher.local import output
from runtime.common import exit_codes
from launcher.common import output_prefix

GangState = monitor.GangState
_TAIL_LINES = 20


def exit_code(end: monitor.End, launcher_signals: list[int]) -> int:
  """The launcher's exit code for the way the pod ended."""
  if end.state is GangState.SUCCEEDED:
    return exit_codes.OK
  if end.state is GangState.FAILED:
    failed = _failed(end)
    assert failed.exit_code is not None
    return failed.exit_code
  if end.state is GangState.PREEMPTED:
    return exit_codes.PREEMPTED
  if end.state is GangState.PREEMPTION_LATE:
    return (exit_codes.SIGNAL_BASE +
            signal.SIGTERM if launcher_signals else exit_codes.PREEMPTED)
  if end.state is GangState.STALLED:
    return exit_codes.STALLED
  assert end.signum is not None, end  # The launcher's own signal is left.
  return exit_codes.SIGNAL_BASE + end.signum


def _failed(end: monitor.End) -> members_lib.Member:
  """The rank that failed first, exited (the monitor ends FAILED on it)."""
  if end.member is None or end.member.exited_at is None:
    raise AssertionError(f'a failed pod without an exited rank: {end}')
  return end.member


def report(end: monitor.End,
           members: list[members_lib.Member],
           console: output.Console,
           started: float,
           logs_dir: str,
           launcher_signals: list[int],
           regrew: bool = False,
           attempt: Optional[int] = None) -> int:
  """Says how the pod ended and returns the launcher's exit code.

  Args:
    end: what the monitor saw last.
    ranks: every rank, exited.
    console: where to say it.
    started: time.monotonic() when the pod started.
    logs_dir: where the ranks' logs are.
    launcher_signals: the signals the launcher got.
    regrew: the launcher stopped the pod to grow it (launcher/local/elastic.py).
    attempt: this pod's attempt number when more attempts may follow (an
      elastic or restarting job), so that its end does not read as the
      job's; None: the pod is the job.
  """
  code = exit_code(end, launcher_signals)
  say, elapsed_s = console.say, time.monotonic() - started
  if end.state is GangState.SUCCEEDED:
    say(f'all {len(members)} ranks finished in {elapsed_s:.1f} s; logs in '
        f'{logs_dir}')
    return code
  if end.state is GangState.FAILED:
    root = _failed(end)
    assert root.exited_at is not None
    _say_root_cause(root, members, say, root.exited_at - started)
  elif end.state is GangState.PREEMPTED and regrew:
    say(f'stopped at a step boundary to grow, {elapsed_s:.1f} s after start: '
        f'every rank saved a checkpoint and exited with code {code}')
    return code
  elif end.state is GangState.PREEMPTED:
    notice = ('SIGTERM to the launcher'
              if launcher_signals else 'a preemption notice to a rank')
    say(f'preempted by {notice}: every rank saved a checkpoint and exited '
        f'with code {code}, {elapsed_s:.1f} s after start. Run the same '
        'command again to resume (or use --max_restarts).')
  else:
    say(_what_stopped_it(end, logs_dir))
    _describe_others(None, members, say)
  ended = f'attempt {attempt} ended with exit code' if attempt else 'exit code'
  say(f'{ended} {code}{exit_codes.signal_suffix(code)}; logs in {logs_dir}')
  return code


def _what_stopped_it(end: monitor.End, logs_dir: str) -> str:
  """The message for a pod the launcher ended itself."""
  if end.state is GangState.PREEMPTION_LATE:
    return (f'the preemption did not complete: {end.message}; killed them. '
            'The next start resumes from the last complete checkpoint.')
  if end.state is GangState.STALLED:
    return (f'the job stalled: {end.message}. Every rank\'s Python stacks '
            f'are in its log under {logs_dir}.')
  assert end.signum is not None, end
  return (f'got {signal.Signals(end.signum).name}: forwarded it to every '
          'rank and stopped the job.')


def _name(member: members_lib.Member, members: list[members_lib.Member]) -> str:
  return f'rank {member.index}/{len(members)}'


def _tail(member: members_lib.Member) -> list[str]:
  """The last _TAIL_LINES lines of the member's log that are not a
  library's routine chatter (output_prefix.routine)."""
  with open(member.log_path, 'rb') as f:
    lines = collections.deque(
        (l for l in (raw.decode('utf-8', 'replace').rstrip('\n')
                     for raw in f) if not output_prefix.routine(l)),
        maxlen=_TAIL_LINES)
  return list(lines)


def _say_root_cause(root: members_lib.Member, members: list[members_lib.Member],
                    say, elapsed_s: float) -> None:
  """The failing rank, when it failed (s after start), its log's tail."""
  code = root.exit_code
  what = ('the job stalled: the hang watchdog of '
          if code == exit_codes.STALLED else '')
  say(f'{what}{_name(root, members)} failed first, with exit code '
      f'{code}{exit_codes.signal_suffix(code)}, {elapsed_s:.1f} s after '
      f'start. Last lines of {root.log_path}:\n' +
      '\n'.join(f'  | {l}' for l in _tail(root)))
  _describe_others(root, members, say)


def _describe_others(root: Optional[members_lib.Member],
                     members: list[members_lib.Member], say) -> None:
  for member in members:
    if member is root:
      continue
    code = member.exit_code
    suffix = exit_codes.signal_suffix(code)
    if (member.signalled_at is not None and member.exited_at is not None and
        member.exited_at >= member.signalled_at):
      how = f'stopped by the launcher, exit code {code}{suffix}'
    else:
      how = f'exit code {code}{suffix}'
    if root is not None and code != 0:
      how += (f', a consequence of {_name(root, members)}\'s failure, not a '
              'cause')
    say(f'{_name(member, members)}: {how}')
