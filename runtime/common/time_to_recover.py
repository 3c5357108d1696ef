"""Time to recover: from a fault to the next attempt's first productive step.

Read from the goodput ledgers (runtime/common/goodput.py) and the launcher's
record of the attempts: when the fault happened and was detected, when the
failed attempt ended, and the next attempt's parts at its first productive
step.
The phases are differences of those, and 'other' is what remains (building
the task, waiting for input), so they add up to the total.

Example:
  >>> phases(ledgers_before, launch_before, ended, chief, launch)['phases']
  {'detection': 0.0, 'teardown': 0.52, 'backoff': 1.0, 'startup': 0.86, ...}
"""

from typing import Any, Optional

PHASES = ('detection', 'teardown', 'backoff', 'startup', 'distributed_init',
          'restore', 'compile', 'recomputed', 'other')


def fault_of(ranks: dict[int, dict[str, Any]],
             launch: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
  """How an attempt failed: {'at', 'detected', ...} wall times, or None.

  The launcher's record when a launcher ran the attempt (the failed
  process's exit, and when the launcher declared the job failed); else the
  earliest a process's supervisor noticed a peer's failure (its last sign of
  life, and the notice).
  """
  if launch is not None and launch.get('fault'):
    return launch['fault']
  noticed = [r['notes']['fault'] for r in ranks.values()
             if isinstance(r['notes'].get('fault'), dict)]
  return min(noticed, key=lambda f: f['detected']) if noticed else None


def phases(before: dict[int, dict[str, Any]],
                    launch_before: Optional[dict[str, Any]],
                    before_end: float, chief: dict[str, Any],
                    launch: Optional[dict[str, Any]]
                    ) -> Optional[dict[str, Any]]:
  """Time to recover: from the fault that ended the attempt before to this
  attempt's first productive step, in PHASES.

  Args:
    before: the earlier attempt's ledgers, {rank: record}.
    launch_before: the launcher's record of it, or None.
    before_end: when it ended (wall time).
    chief: this attempt's process 0 ledger.
    launch: the launcher's record of this attempt, or None.

  Returns:
    {'total_s', 'phases': {phase: seconds}, 'restore_tier', 'restore_step',
     'recomputed_steps'}; None when the earlier attempt did not fail or
    this one made no new step.
  """
  fault = fault_of(before, launch_before)
  first = chief['notes'].get('first_productive')
  if fault is None or not first:
    return None
  parts = first['parts']
  started = launch['started'] if launch else chief['started']
  phases = {
      'detection': fault['detected'] - fault['at'],
      'teardown': before_end - fault['detected'],
      'backoff': started - before_end,
      'startup': parts['startup'] + max(0.0, chief['started'] - started),
      'distributed_init': parts['distributed_init'],
      'restore': parts['checkpoint_restore'],
      'compile': parts['compile'],
      'recomputed': parts['recomputed']}
  total = first['wall'] - fault['at']
  phases['other'] = total - sum(phases.values())
  return {'total_s': total, 'phases': phases,
          'restore_tier': chief['notes'].get('restore_tier'),
          'restore_step': chief['notes'].get('restore_step'),
          'recomputed_steps': chief['notes'].get('recomputed_steps', 0)}
