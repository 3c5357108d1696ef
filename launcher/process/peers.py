"""What the processes of a job know of each other, through their heartbeats.

Every process publishes, once a second, a heartbeat record under
`podrun/beat/RANK` in the coordination service: its host, its last started
and completed steps, and its recent step times. From these, process 0
finds lost processes and stragglers, and every process names the laggards
of a stalled job. The functions on records are pure, so they are tested
without processes (tests/test_supervisor.py).

A launcher that saw hosts go (the TPU driver, a slice PREEMPTED) says so
in the file PODRUN_GONE_FILE names (`Gone`): a process it names is lost
after GONE_SILENCE_S without a heartbeat rather than --heartbeat_timeout,
which is long so that a slow process is not taken for a dead one. Its
heartbeat going on (a preempted process saving, with the others, the step
they agreed on) keeps it in the job. A host the launcher found dead itself
(podrun-ray: its raylet takes no connection) is `dead`: its process is
lost after DEAD_SILENCE_S.
"""

import dataclasses
import json
import os
import socket
import time
from typing import Any, Optional

from absl import logging
import numpy as np

from runtime.common import handoff
from runtime.common import progress
from runtime.common import records as records_lib
from runtime import coordination

BEAT_DIR = 'podrun/beat'
_STRAGGLER_RATIO = 1.5
_STRAGGLER_MIN_STEPS = 10
_STRAGGLER_WARN_EVERY_S = 60.0
# Seconds between two heartbeats of a process.
BEAT_EVERY_S = 1.0
# Seconds without a heartbeat after which a process whose host the launcher
# saw go is lost: three beats missed.
GONE_SILENCE_S = 3 * BEAT_EVERY_S
# The same for a host the launcher found dead: two beats missed. Not one:
# a process that outlived its node's raylet and still beats, a second
# apart, may be read twice between two of its beats.
DEAD_SILENCE_S = 2 * BEAT_EVERY_S


@dataclasses.dataclass(frozen=True)
class Gone:
  """The processes whose hosts the launcher saw go, what it saw, and those
  whose hosts it found dead (a subset)."""
  processes: frozenset = frozenset()
  why: str = ''
  dead: frozenset = frozenset()

  def silence_allowed(self, process_index: int,
                      heartbeat_timeout: float) -> float:
    if process_index in self.dead:
      return min(DEAD_SILENCE_S, heartbeat_timeout)
    if process_index in self.processes:
      return min(GONE_SILENCE_S, heartbeat_timeout)
    return heartbeat_timeout

  def reason(self, process_index: int) -> str:
    if process_index not in self.processes:
      return ''
    seen = f' ({self.why})' if self.why else ''
    if process_index in self.dead:
      return f', and the launcher found its host dead{seen}'
    return f', and the launcher saw its host go{seen}'


def gone(path: Optional[str] = None) -> Gone:
  """What the launcher wrote to `path` (default: the file PODRUN_GONE_FILE
  names); Gone() when it wrote nothing, or nothing readable."""
  path = path if path is not None else handoff.current().gone_file
  if not path:
    return Gone()
  try:
    with open(path) as f:
      record = json.load(f)
    processes = frozenset(int(p) for p in record.get('processes', ()))
    return Gone(processes, str(record.get('why', '')),
                processes & frozenset(int(p) for p in record.get('dead', ())))
  except (OSError, ValueError, TypeError, AttributeError):
    return Gone()


class Peers:
  """This process's heartbeats, and process 0's view of the others'.

  Example:
    >>> peers = Peers(coordination.current(), 'host-0', heartbeat_timeout=15)
    >>> peers.publish_own(progress.snapshot(), beat=1, supervisor_cpu_s=0.0)
    >>> peers.find_lost(time.monotonic())     # on process 0
  """

  def __init__(self, client: coordination.Client, host: str,
               heartbeat_timeout: float):
    self.client, self.host = client, host
    self.heartbeat_timeout = heartbeat_timeout
    self.last_change: dict[int, tuple[int, float]] = {}
    self.last_check: Optional[float] = None
    self.warned_at: dict[int, float] = {}

  def publish_own(self, snapshot: progress.Snapshot, beat: int,
                  supervisor_cpu_s: float) -> bool:
    """Publishes this process's heartbeat; whether the service took it."""
    record = {
        'beat': beat,
        'host': self.host,
        'pid': os.getpid(),
        'done': snapshot.done_step,
        'begun': snapshot.begun_step,
        'step': progress.summarize(snapshot.step_seconds),
        'own': progress.summarize(snapshot.own_seconds),
        'supervisor_cpu_s': supervisor_cpu_s
    }
    try:
      self.client.publish(BEAT_DIR, json.dumps(record))
    except Exception:  # pylint: disable=broad-except
      return False  # The supervisor notices a coordinator that stays silent.
    return True

  def records(self) -> dict[int, dict[str, Any]]:
    return {
        i: json.loads(value)
        for i, value in self.client.by_process(BEAT_DIR).items()
    }

  def find_lost(
      self, now: float, gone_now: Gone = Gone()) -> Optional[records_lib.Fault]:
    """The first process silent for --heartbeat_timeout (GONE_SILENCE_S
    when `gone_now` names it), or None."""
    starved_after = max(self.heartbeat_timeout / 2, 3 * BEAT_EVERY_S)
    if self.last_check is not None and now - self.last_check > starved_after:
      # This thread itself was starved (a long GIL hold): forgive everyone.
      self.last_change = {}
    self.last_check = now
    try:
      records = self.records()
    except Exception:  # pylint: disable=broad-except
      return None
    for process_index in range(1, self.client.process_count):
      record = records.get(process_index, {'beat': None, 'host': '?'})
      seen = self.last_change.get(process_index)
      if seen is None or seen[0] != record['beat']:
        self.last_change[process_index] = (record['beat'], now)
        continue
      silent = now - seen[1]
      allowed = gone_now.silence_allowed(process_index, self.heartbeat_timeout)
      if silent > allowed:
        return records_lib.Fault(
            'lost',
            process_index,
            record.get('host', '?'),
            summary=(
                f'no heartbeat for {silent:.0f} s (--heartbeat_timeout='
                f'{self.heartbeat_timeout:g})'
                f'{gone_now.reason(process_index)}; its last completed step '
                f'was {record.get("done")}'),
            at=time.time() - silent)
    return None

  def warn_stragglers(self, now: float) -> None:
    try:
      records = self.records()
    except Exception:  # pylint: disable=broad-except
      return
    for process_index, warning in straggler_warnings(records):
      last = self.warned_at.get(process_index, -1e9)
      if now - last >= _STRAGGLER_WARN_EVERY_S:
        self.warned_at[process_index] = now
        logging.warning('%s', warning)

  def describe_laggards(self) -> str:
    try:
      records = self.records()
    except Exception as e:  # pylint: disable=broad-except
      return f'the laggards are unknown: {first_line(e)}'
    return describe_laggards(records, self.client.process_count)


def describe_laggards(records: dict[int, dict[str, Any]],
                      process_count: int) -> str:
  """Names the processes the others wait for, from their last heartbeats.

  A process that has not started the step the furthest process started is
  behind: it is stuck before the step (its input, its own code), and the
  others wait for it inside the step's collectives.

  Args:
    records: {process index: heartbeat record with 'begun', 'done' and 'host'}.
    process_count: processes in the job.

  Example:
    >>> describe_laggards({0: {'begun': 13, 'done': 12, 'host': 'a'},
    ...                    1: {'begun': 12, 'done': 12, 'host': 'b'}}, 2)
    'laggards: rank 1 on b (started step 12, while rank 0 started step 13)'
  """
  silent = [r for r in range(process_count) if r not in records]
  begun = {r: rec.get('begun') or 0 for r, rec in records.items()}
  parts = []
  if begun:
    furthest = max(begun.values())
    ahead = min(r for r, b in begun.items() if b == furthest)
    behind = sorted(r for r, b in begun.items() if b < furthest)
    if behind:
      parts.append('laggards: ' + ', '.join(
          f'rank {r} on {records[r].get("host", "?")} (started step '
          f'{begun[r]}, while rank {ahead} started step {furthest})'
          for r in behind))
    else:
      parts.append(f'no rank is behind: every rank started step {furthest}')
  if silent:
    parts.append('no heartbeat ever from ' +
                 ', '.join(f'rank {r}' for r in silent))
  return '; '.join(parts)


def straggler_warnings(
    records: dict[int, dict[str, Any]]) -> list[tuple[int, str]]:
  """(process index, warning) of each process much slower on its own than
  the rest.

  A process's own time per step is what it spends before it can start the
  step (input, dispatch); the others wait that long in the step's
  collectives. A rank is a straggler when its recent median is over 1.5x
  the median of the other ranks' and the difference is a noticeable share
  (5 %) of the step time. Ranks with fewer than 10 steps are left out.

  Example:
    >>> fast = {'own': {'median': 0.001, 'count': 50}, 'step': {'median': 0.1}}
    >>> slow = {'own': {'median': 0.1, 'count': 50}, 'step': {'median': 0.1}}
    >>> straggler_warnings({0: fast, 1: slow})[0][0]
    1
  """
  own = {
      r: rec['own']['median']
      for r, rec in records.items()
      if (rec.get('own') or {}).get('count', 0) >= _STRAGGLER_MIN_STEPS
  }
  steps = [
      rec['step']['median']
      for rec in records.values()
      if (rec.get('step') or {}).get('median') is not None
  ]
  if len(own) < 2 or not steps:
    return []
  step_time = float(np.median(steps))
  out = []
  for process_index, value in sorted(own.items()):
    others = float(np.median([v for i, v in own.items() if i != process_index]))
    if value > _STRAGGLER_RATIO * others and value - others > 0.05 * step_time:
      host = records[process_index].get('host', '?')
      out.append(
          (process_index,
           (f'straggler: rank {process_index} on {host} '
            f'spends {value:.3f} s of its own per step (input, dispatch), '
            f'{value / max(others, 1e-9):.1f}x the {others:.3f} s of the other '
            f'{len(own) - 1} rank(s) (median); every step of the job waits for '
            f'it (step time {step_time:.3f} s)')))
  return out


def rank_stats(client: Optional[coordination.Client]) -> list[dict[str, Any]]:
  """Each process's step-time median and p99, for summary.json."""
  records: dict[int, dict[str, Any]]
  if client is None:
    snapshot = progress.snapshot()
    records = {
        0: {
            'host': socket.gethostname(),
            'step': progress.summarize(snapshot.step_seconds),
            'own': progress.summarize(snapshot.own_seconds)
        }
    }
  else:
    records = {i: json.loads(v) for i, v in client.by_process(BEAT_DIR).items()}
  return [{
      'rank': r,
      'host': rec.get('host'),
      'step_time_median_s': rec.get('step', {}).get('median'),
      'step_time_p99_s': rec.get('step', {}).get('p99'),
      'own_time_median_s': rec.get('own', {}).get('median'),
      'supervisor_cpu_s': rec.get('supervisor_cpu_s')
  } for r, rec in sorted(records.items())]


def first_line(error: BaseException) -> str:
  """'ValueError: the first line of its message'."""
  text = str(error).strip().splitlines()
  return f'{type(error).__name__}: {text[0] if text else ""}'.rstrip(': ')
