"""The job's goodput, rolled up from every process's ledger and the
launcher's attempts: what `podrun` prints at its end, summary.json's
`goodput`, WORKDIR/goodput.jsonl and scripts/goodput.py.

A process writes its ledger (runtime/common/goodput.py); only the
launcher's side and the scripts read them all back, so the roll-up lives
here. Each attempt after a failure gets its time to recover
(time_to_recover.py).

Example:
  >>> goodput_rollup.rollup(layout.Record('/runs/mnist'))['goodput']
  0.93
"""

import json
from typing import Any, Optional, TypedDict

from launcher.common import time_to_recover
from runtime.common import files
from runtime.common import layout
from runtime.common import records
from runtime.common import goodput


def _read_ledgers(
    record: layout.Record) -> dict[str, dict[int, records.LedgerRecord]]:
  """{attempt: {process index: ledger record}}."""
  out: dict[str, dict[int, records.LedgerRecord]] = {}
  for attempt, ranks in record.attempts_with_ledgers().items():
    for process_index, path in ranks.items():
      try:
        with open(path) as f:
          out.setdefault(attempt, {})[process_index] = json.load(f)
      except (OSError, ValueError):
        continue
  return out


def _launcher_attempts(
    record: layout.Record,
    path: Optional[str] = None) -> list[records.LauncherAttempt]:
  return records.read_attempts(path or record.attempts())


def rollup(record: layout.Record,
           attempts_path: Optional[str] = None) -> records.RollUp:
  """Accounts for the job's wall time, attempt by attempt.

  The job runs from its first attempt's start (the launcher's, else the
  process's) to its last attempt's end (the launcher's, else the last ledger
  update), less the time between commands: when an attempt was started by
  another command than the one before it (a second `podrun` after a Ctrl-C,
  a resume as another topology), nothing ran the job from the end of the one
  before to that command's start. That time is `between_commands_s`, not a
  part: no launcher waited it. Each attempt is seen through process 0's
  ledger; the time a launcher waited between two attempts, and the
  unrecorded end of a killed attempt, are parts of their own. The parts add
  up to `wall_s`.

  Returns:
    records.RollUp; empty parts when nothing was recorded.
  """
  ledgers = _read_ledgers(record)
  by_name = {
      a.name: a for a in _launcher_attempts(record, attempts_path) if a.name
  }
  order = sorted(ledgers, key=lambda a: _ledger_of_0(ledgers[a])['started'])
  attempts: list[records.AttemptRow] = []
  for number, name in enumerate(order, 1):
    before = order[number - 2] if number > 1 else None
    attempts.append(
        _attempt_record(number, name, _ledger_of_0(ledgers[name]),
                        by_name.get(name), attempts[-1] if attempts else None,
                        by_name.get(before) if before is not None else None))
    if before is not None:
      attempts[-1]['recovery'] = time_to_recover.phases(
          ledgers[before],
          by_name.get(before),
          attempts[-2]['ended'],
          _ledger_of_0(ledgers[name]),
          by_name.get(name),
          between_commands_s=attempts[-1]['between_commands_s'])
  if not attempts:
    return {
        'wall_s': 0.0,
        'goodput': None,
        'between_commands_s': 0.0,
        'full_devices': None,
        'reduced_size_s': None,
        'capacity_goodput': None,
        'parts': {},
        'attempts': [],
        'ranks': {}
    }
  wall = sum(a['wall_s'] for a in attempts)
  parts = {
      p: sum(a['parts'][p] for a in attempts)
      for p in goodput.PROCESS_PARTS + goodput.JOB_PARTS
  }
  return {
      'wall_s': wall,
      'goodput': parts['productive'] / wall if wall > 0 else None,
      'between_commands_s': sum(a['between_commands_s'] for a in attempts),
      **capacity(attempts), 'parts': parts,
      'attempts': attempts,
      'ranks': {
          name: {
              r: rec['parts'] for r, rec in sorted(ledgers[name].items())
          } for name in order
      }
  }


class Capacity(TypedDict):
  """`capacity`'s figures (records.RollUp's keys of the same names)."""
  full_devices: Optional[int]
  reduced_size_s: Optional[float]
  capacity_goodput: Optional[float]


def capacity(attempts: list[records.AttemptRow]) -> Capacity:
  """Goodput weighed by the devices each attempt ran on.

  A job that goes on at reduced size (an elastic job's fewer processes)
  trains, but more slowly: its productive seconds are worth less of the
  full job's. The full size is the most devices any attempt ran on.

  Returns:
    {'full_devices': D, 'reduced_size_s': the wall time of attempts on
     fewer than D devices, 'capacity_goodput': productive device-seconds
     over D x the wall time}; None values when no attempt noted its
    topology.
  """
  devices = [((a['notes'] or {}).get('topology') or {}).get('num_devices')
             for a in attempts]
  if not any(devices):
    return {
        'full_devices': None,
        'reduced_size_s': None,
        'capacity_goodput': None
    }
  full = max(d for d in devices if d)
  wall = sum(a['wall_s'] for a in attempts)
  used = sum(
      a['parts']['productive'] * (d or full) for a, d in zip(attempts, devices))
  return {
      'full_devices':
          full,
      'reduced_size_s':
          sum(a['wall_s'] for a, d in zip(attempts, devices) if d and d < full),
      'capacity_goodput':
          used / (full * wall) if wall > 0 else None
  }


def _ledger_of_0(
    ranks: dict[int, records.LedgerRecord]) -> records.LedgerRecord:
  """Process 0's ledger, through which the job sees an attempt."""
  return ranks.get(0) or ranks[min(ranks)]


def _same_command(launch: Optional[records.LauncherAttempt],
                  before: Optional[records.LauncherAttempt]) -> bool:
  """Whether one launcher process ran both attempts (and so waited the
  time between them)."""
  if launch is None or before is None:
    return False
  if launch.launcher_started is not None:
    return launch.launcher_started == before.launcher_started
  return (launch.attempt or 1) > 1


def _attempt_record(
    number: int, name: str, ledger_0: records.LedgerRecord,
    launch: Optional[records.LauncherAttempt],
    previous: Optional[records.AttemptRow],
    launch_before: Optional[records.LauncherAttempt]) -> records.AttemptRow:
  """One attempt's parts, from its command's start (or the end of the
  attempt before, when the same command ran both) to its end."""
  parts = {p: 0.0 for p in goodput.PROCESS_PARTS + goodput.JOB_PARTS}
  parts.update(ledger_0['parts'])
  started, ended = ledger_0['started'], ledger_0['updated']
  if launch is not None:
    # The launcher saw the attempt from before the process started to after
    # it ended: that is launch overhead, or the process's unrecorded end. A
    # record the launcher did not finish counts from what the ledger saw.
    launch_started = launch.started if launch.started is not None else started
    ended = max(ended, launch.ended if launch.ended is not None else ended)
    late = ended - ledger_0['updated']
    parts['launch_overhead' if ledger_0['final'] else 'unrecorded'] += late
    parts['launch_overhead'] += max(0.0, started - launch_started)
    moved = min(launch.recreate_s, parts['launch_overhead'])
    parts['launch_overhead'] -= moved
    parts['infrastructure_recovery'] += moved
    started = min(started, launch_started)
  between_commands = 0.0
  if previous is not None and _same_command(launch, launch_before):
    _book_backoff(parts, started - previous['ended'])
    started = previous['ended']
  else:
    command_started = ((launch.launcher_started or launch.started or started)
                       if launch is not None else started)
    if previous is not None:
      # A command started before the one before it ended (two terminals)
      # still starts this attempt no earlier than that end.
      command_started = max(command_started, previous['ended'])
      between_commands = max(0.0, command_started - previous['ended'])
    parts['launch_overhead'] += max(0.0, started - command_started)
    _take_out(parts, max(0.0, command_started - started),
              ('launch_overhead', 'startup'))
    started = command_started
  return {
      'attempt': number,
      'name': name,
      'started': started,
      'ended': ended,
      'wall_s': ended - started,
      'final': ledger_0['final'],
      'between_commands_s': between_commands,
      'exit_code': launch.exit_code if launch else None,
      'notes': ledger_0['notes'],
      'parts': parts,
      'other_named': dict(ledger_0.get('other_named') or {})
  }


def _book_backoff(parts: dict[str, float], gap: float) -> None:
  """The time one launcher waited between two attempts."""
  if gap >= 0:
    parts['restart_backoff'] += gap
  else:
    # A restart at once, and a process start read from /proc in clock
    # ticks (10 ms), can put the start before the previous end; the
    # overlap is an error of that estimate, not time spent twice.
    _take_out(parts, -gap, ('launch_overhead', 'startup'))


def _take_out(parts: dict[str, float], seconds: float,
              categories: tuple[str, ...]) -> None:
  """Removes `seconds` from `categories`, in order, none below zero."""
  for category in categories:
    taken = min(seconds, parts[category])
    parts[category] -= taken
    seconds -= taken


def roll_up_into_summary(record: layout.Record) -> records.RollUp:
  """Writes WORKDIR/goodput.jsonl, and WORKDIR/summary.json from run.json
  (when a run finished), from every ledger and launcher attempt the workdir
  holds; returns the roll-up (`rollup`)."""
  result = write_rollup(record)
  records.with_goodput(record, summary(result))
  return result


def write_rollup(record: layout.Record,
                 attempts_path: Optional[str] = None) -> records.RollUp:
  """Writes WORKDIR/goodput.jsonl (one line per attempt) and returns the
  roll-up (see `rollup`; `attempts_path`: the launcher's attempts.jsonl
  where it is not WORKDIR/logs, as for the TPU pod driver's LOG_DIR)."""
  result = rollup(record, attempts_path)
  path = record.rollup()
  files.write_atomic(
      path, ''.join(
          json.dumps({
              **attempt, 'ranks': result['ranks'][attempt['name']]
          }) + '\n' for attempt in result['attempts']))
  return result


def summary(result: records.RollUp) -> records.SummaryGoodput:
  """The part of a roll-up that goes into summary.json."""
  return {
      'wall_s': result['wall_s'],
      'goodput': result['goodput'],
      'capacity_goodput': result.get('capacity_goodput'),
      'reduced_size_s': result.get('reduced_size_s'),
      'parts': result['parts'],
      'attempts': len(result['attempts'])
  }
