"""Time to recover: from a fault to the next attempt's first productive step.

Read from the goodput ledgers (runtime/common/goodput.py) and the launcher's
record of the attempts: when the fault happened and was detected, when the
failed attempt ended, and the next attempt's parts at its first productive
step.
The phases are differences of those, and 'other' is what remains (building
the task, waiting for input), so they add up to the total.

Example:
  >>> phases(ledgers_before, launch_before, ended, ledger_0, launch)['phases']
  {'detection': 0.0, 'teardown': 0.52, 'backoff': 1.0, 'startup': 0.86, ...}
"""

import math
from typing import Any, Mapping, Optional, Union

from runtime.common import records

PHASES = ('detection', 'teardown', 'backoff', 'startup', 'distributed_init',
          'restore', 'compile', 'recomputed', 'other')

# A launcher's record of an attempt, typed or as its attempts.jsonl line.
Launch = Union[records.LauncherAttempt, dict[str, Any], None]


def _fault(ranks: Mapping[int, records.LedgerRecord],
           launch: Launch) -> Optional[records.Fault]:
  launch = records.as_attempt(launch)
  if launch is not None and launch.fault is not None:
    return launch.fault
  noticed = [
      n.fault for n in (records.Notes.from_json(r.get('notes'))
                        for r in ranks.values()) if n.fault
  ]
  if noticed:
    # The first the job learned of; one only being told comes last.
    return min(noticed,
               key=lambda f: math.inf if f.detected is None else f.detected)
  return _unwritten_ends(ranks) if launch is None else None


def _unwritten_ends(
    ranks: Mapping[int, records.LedgerRecord]) -> Optional[records.Fault]:
  """The fault of an attempt whose processes all died without writing
  their end (a SIGKILL, and survivors that JAX's coordination service then
  aborted with SIGABRT, before any supervisor could note it): the first to
  stop writing its ledger failed then, the last one's end is when the job
  knew. None when a process ended in order."""
  if not ranks or any(r.get('final') for r in ranks.values()):
    return None
  first = min(ranks, key=lambda r: ranks[r]['updated'])
  return records.Fault(at=ranks[first]['updated'],
                       detected=max(r['updated'] for r in ranks.values()),
                       process_index=first,
                       kind='unrecorded')


def fault_of(ranks: Mapping[int, records.LedgerRecord],
             launch: Launch) -> Optional[dict[str, Any]]:
  """How an attempt failed: {'at', 'detected', ...} wall times, or None.

  The launcher's record when a launcher ran the attempt (the failed
  process's exit, and when the launcher declared the job failed); else the
  earliest a process's supervisor noticed a peer's failure (its last sign of
  life, and the notice).

  Args:
    ranks: the attempt's ledgers, {process index: record as written}.
    launch: the launcher's record of it, or None.
  """
  fault = _fault(ranks, launch)
  return None if fault is None else fault.to_json()


def phases(before: Mapping[int, records.LedgerRecord],
           launch_before: Launch,
           before_end: float,
           ledger_0: records.LedgerRecord,
           launch: Launch,
           between_commands_s: float = 0.0) -> Optional[dict[str, Any]]:
  """Time to recover: from the fault that ended the attempt before to this
  attempt's first productive step, in PHASES.

  Args:
    before: the earlier attempt's ledgers, {process index: record}.
    launch_before: the launcher's record of it, or None.
    before_end: when it ended (wall time).
    ledger_0: this attempt's process 0 ledger.
    launch: the launcher's record of this attempt, or None.
    between_commands_s: how long no command ran the job between the two
      attempts (a person starting it again): not part of the recovery.

  Returns:
    {'total_s', 'phases': {phase: seconds}, 'other_named': {name: seconds}
     (what of the new attempt's own 'other' had a name by its first
     productive step; goodput.OTHER_NAMES), 'restore_tier', 'restore_step',
     'recomputed_steps'}; None when the earlier attempt did not fail or
    this one made no new step.
  """
  fault = _fault(before, launch_before)
  notes = records.Notes.from_json(ledger_0.get('notes'))
  first = notes.first_productive
  if fault is None or fault.detected is None or not first:
    return None
  parts = first.parts
  launch = records.as_attempt(launch)
  started = (launch.started
             if launch and launch.started is not None else ledger_0['started'])
  phases = {
      'detection': fault.detected - fault.at,
      'teardown': before_end - fault.detected,
      'backoff': max(0.0, started - before_end - between_commands_s),
      'startup': parts['startup'] + max(0.0, ledger_0['started'] - started),
      'distributed_init': parts['distributed_init'],
      'restore': parts['checkpoint_restore'],
      'compile': parts['compile'],
      'recomputed': parts['recomputed']
  }
  total = first.wall - fault.at - between_commands_s
  phases['other'] = total - sum(phases.values())
  return {
      'total_s': total,
      'phases': phases,
      # What of the attempt's own 'other' had a name by then.
      'other_named': dict(first.other_named or {}),
      'restore_tier': notes.restore_tier,
      'restore_step': notes.restore_step,
      'recomputed_steps': notes.recomputed_steps or 0
  }
