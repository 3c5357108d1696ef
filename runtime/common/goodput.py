"""Where a job's wall-clock time went: a ledger per process and attempt.

Every process of every attempt keeps a `Ledger` of seconds per category and
rewrites it, whole, to WORKDIR/goodput/ATTEMPT/rank_<i>.json every few
seconds and when it ends. `rollup` then reads every attempt's ledgers (and
the launcher's WORKDIR/logs/attempts.jsonl, when a launcher restarted the
job) and accounts for the job's whole wall time:

- per process: `startup` (process start, imports, config, devices),
  `distributed_init`, `checkpoint_restore`, `compile` (the seconds JAX's
  own compilation and compilation-cache events report, wherever they
  happen, taken out of the step that paid for them: `on_compile`),
  `productive` (the rest of every step), `recomputed` (steps an earlier attempt
  had already trained: lost work), `input_wait`, `checkpoint_blocking`,
  `evaluation`, `preemption_save`, and `other` (the rest of the process's
  life: building the task, writing results);
- per job: `unrecorded` (the end of an attempt that was killed before it
  could write its ledger: its last seconds are lost, not dropped),
  `launch_overhead` (the launcher starting and reaping the processes) and
  `restart_backoff` (a launcher waiting between two attempts it ran).
  The time between two commands (a Ctrl-C, then the same command again an
  hour later) is no part: it is reported as `between_commands_s`, outside
  the job's wall time.

Goodput = productive / wall time. Nothing here imports JAX: the launcher
rolls up without it.

Which steps are recomputed is exact however an attempt ended: every process
stores the last step it completed in an 8-byte memory-mapped file beside its
ledger (`HighWater`), which survives a SIGKILL. Each attempt after a failure
also gets its time to recover (runtime/common/time_to_recover.py): from the
fault to its first productive step, split into detection, teardown,
back-off, start-up, distributed init, restore (with the tier it came from),
compile and recomputed steps.

Example:
  >>> ledger = Ledger(process_start=time.time())
  >>> with ledger.timing('checkpoint_restore'):
  ...   restore()
  >>> rollup('/runs/mnist')['goodput']
  0.93
"""

import contextlib
import glob
import json
import mmap
import os
import struct
import threading
import time
from typing import Any, Iterator, Optional

from runtime.common import files
from runtime.common import records
from runtime.common import time_to_recover

PROCESS_PARTS = ('startup', 'distributed_init', 'checkpoint_restore',
                 'compile', 'productive', 'recomputed', 'input_wait',
                 'checkpoint_blocking', 'evaluation', 'preemption_save',
                 'other')
# infrastructure_recovery: bringing machines back before an attempt could
# start (a TPU slice deleted and created again after a preemption).
JOB_PARTS = ('unrecorded', 'launch_overhead', 'restart_backoff',
             'infrastructure_recovery')
LEDGER_DIR = 'goodput'
_FLUSH_EVERY_S = 2.0


def process_start_time() -> float:
  """Wall time at which this process started (Linux), else now."""
  try:
    with open('/proc/self/stat') as f:
      ticks = int(f.read().rsplit(')', 1)[1].split()[19])
    with open('/proc/uptime') as f:
      uptime = float(f.read().split()[0])
    # /proc/stat's boot time is whole seconds; the uptime is finer.
    return time.time() - (uptime - ticks / os.sysconf('SC_CLK_TCK'))
  except (OSError, ValueError, IndexError):
    return time.time()


@contextlib.contextmanager
def _timed(record) -> Iterator[None]:
  started = time.perf_counter()
  try:
    yield
  finally:
    record(time.perf_counter() - started)


class Ledger:
  """Seconds per category for one process of one attempt.

  Categories are PROCESS_PARTS; 'other' is never added to: it is whatever
  of the process's life the others do not cover.
  """

  def __init__(self, process_start: Optional[float] = None):
    self.started = process_start if process_start else process_start_time()
    self.parts = {p: 0.0 for p in PROCESS_PARTS if p != 'other'}
    self.notes = records.Notes()
    self.path: Optional[str] = None
    self._lock = threading.Lock()
    self._last_flush = 0.0

  def add(self, category: str, seconds: float) -> None:
    if category not in self.parts:
      raise ValueError(f'unknown goodput category {category!r}; one of '
                       f'{", ".join(self.parts)}')
    with self._lock:
      self.parts[category] += max(0.0, seconds)

  def timing(self, category: str):
    """A context manager that adds its duration to `category`."""
    return _timed(lambda seconds: self.add(category, seconds))

  def note(self, **values: Any) -> None:
    """Sets fields of `notes` (records.Notes); an unknown name raises."""
    with self._lock:
      for name, value in values.items():
        if not hasattr(self.notes, name):
          raise TypeError(f'the goodput ledger has no note {name!r}; see '
                          'runtime/common/records.py Notes')
        setattr(self.notes, name, value)

  def record(self, final: bool) -> dict[str, Any]:
    now = time.time()
    with self._lock:
      parts = dict(self.parts)
      notes = self.notes.to_json()
    parts['other'] = max(0.0, now - self.started - sum(parts.values()))
    return {'started': self.started, 'updated': now, 'final': final,
            'parts': parts, 'notes': notes}

  def flush(self, final: bool = False, force: bool = False) -> None:
    """Rewrites the ledger file; at most every 2 s unless final or forced."""
    if self.path is None:
      return
    now = time.monotonic()
    if not (final or force) and now - self._last_flush < _FLUSH_EVERY_S:
      return
    self._last_flush = now
    try:
      files.write_json(self.path, self.record(final))
    except OSError:
      pass  # A ledger must never stop a job.


_current = Ledger(process_start=time.time())


def current() -> Ledger:
  """This process's ledger (one that writes nowhere until `open_ledger`)."""
  return _current


def use(ledger: Ledger) -> None:
  """Makes `ledger` this process's, before it has a file to write to."""
  global _current
  _current = ledger


def open_ledger(ledger: Ledger, workdir: str, attempt: str,
                process_index: int) -> None:
  """Makes `ledger` this process's, writing to WORKDIR/goodput/ATTEMPT."""
  global _current
  ledger.path = os.path.join(workdir, LEDGER_DIR, attempt,
                             f'rank_{process_index}.json')
  ledger.note(attempt=attempt, process_index=process_index)
  _current = ledger
  ledger.flush(force=True)


class HighWater:
  """The last step a process completed, in an 8-byte file mapped to memory.

  Written after every step: a store to memory, which the kernel keeps when
  the process is SIGKILLed, so the next attempt knows exactly which steps it
  trains again (the ledger's JSON is rewritten only every 2 s).
  """

  def __init__(self, path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
      f.write(bytes(8))
    with open(path, 'r+b') as f:
      self._map = mmap.mmap(f.fileno(), 8)

  def write(self, step: int) -> None:
    self._map[:8] = struct.pack('<q', step)

  @staticmethod
  def read(path: str) -> int:
    try:
      with open(path, 'rb') as f:
        return struct.unpack('<q', f.read(8))[0]
    except (OSError, struct.error):
      return 0


def high_water_path(ledger_path: str) -> str:
  return ledger_path[:-len('.json')] + '.step'


def steps_done_before(ledger: Ledger) -> int:
  """The furthest step any process of an earlier attempt of the job
  completed (0 when the ledger writes nowhere)."""
  if ledger.path is None:
    return 0
  this_attempt = os.path.dirname(ledger.path)
  furthest = 0
  for path in glob.glob(os.path.join(os.path.dirname(this_attempt), '*',
                                     'rank_*.step')):
    if os.path.dirname(path) != this_attempt:
      furthest = max(furthest, HighWater.read(path))
  for path in glob.glob(os.path.join(os.path.dirname(this_attempt), '*',
                                     'rank_*.json')):
    if os.path.dirname(path) == this_attempt:
      continue
    try:
      with open(path) as f:
        notes = records.Notes.from_json(json.load(f).get('notes'))
      furthest = max(furthest, notes.last_step or 0)
    except (OSError, ValueError, KeyError):
      continue
  return furthest


def _read_ledgers(workdir: str) -> dict[str, dict[int, dict[str, Any]]]:
  """{attempt: {rank: ledger record}}."""
  out: dict[str, dict[int, dict[str, Any]]] = {}
  for path in glob.glob(os.path.join(workdir, LEDGER_DIR, '*', 'rank_*.json')):
    try:
      with open(path) as f:
        record = json.load(f)
    except (OSError, ValueError):
      continue
    attempt = os.path.basename(os.path.dirname(path))
    rank = int(os.path.basename(path)[len('rank_'):-len('.json')])
    out.setdefault(attempt, {})[rank] = record
  return out


def _launcher_attempts(workdir: str, path: Optional[str] = None
                       ) -> list[records.LauncherAttempt]:
  return records.read_attempts(
      path or os.path.join(workdir, 'logs', records.ATTEMPTS_FILE))


def rollup(workdir: str, attempts_path: Optional[str] = None
           ) -> dict[str, Any]:
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
    {'wall_s', 'goodput', 'between_commands_s', 'parts': {category:
     seconds}, 'attempts': [...], 'ranks': {attempt: {rank: parts}}}; empty
    parts when nothing was recorded.
  """
  ledgers = _read_ledgers(workdir)
  by_name = {a.name: a for a in _launcher_attempts(workdir, attempts_path)
             if a.name}
  order = sorted(ledgers, key=lambda a: _ledger_of_0(ledgers[a])['started'])
  attempts: list[dict[str, Any]] = []
  for number, name in enumerate(order, 1):
    before = order[number - 2] if number > 1 else None
    attempts.append(_attempt_record(
        number, name, _ledger_of_0(ledgers[name]), by_name.get(name),
        attempts[-1] if attempts else None, by_name.get(before)))
    if before is not None:
      attempts[-1]['recovery'] = time_to_recover.phases(
          ledgers[before], by_name.get(before), attempts[-2]['ended'],
          _ledger_of_0(ledgers[name]), by_name.get(name),
          between_commands_s=attempts[-1]['between_commands_s'])
  if not attempts:
    return {'wall_s': 0.0, 'goodput': None, 'between_commands_s': 0.0,
            'parts': {}, 'attempts': [], 'ranks': {}}
  wall = sum(a['wall_s'] for a in attempts)
  parts = {p: sum(a['parts'][p] for a in attempts)
           for p in PROCESS_PARTS + JOB_PARTS}
  return {'wall_s': wall,
          'goodput': parts['productive'] / wall if wall > 0 else None,
          'between_commands_s': sum(a['between_commands_s']
                                    for a in attempts),
          **capacity(attempts),
          'parts': parts, 'attempts': attempts,
          'ranks': {name: {r: rec['parts'] for r, rec in sorted(
              ledgers[name].items())} for name in order}}


def capacity(attempts: list[dict[str, Any]]) -> dict[str, Any]:
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
    return {'full_devices': None, 'reduced_size_s': None,
            'capacity_goodput': None}
  full = max(d for d in devices if d)
  wall = sum(a['wall_s'] for a in attempts)
  used = sum(a['parts']['productive'] * (d or full)
             for a, d in zip(attempts, devices))
  return {'full_devices': full,
          'reduced_size_s': sum(a['wall_s'] for a, d in zip(attempts, devices)
                                if d and d < full),
          'capacity_goodput': used / (full * wall) if wall > 0 else None}


def _ledger_of_0(ranks: dict[int, dict[str, Any]]) -> dict[str, Any]:
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


def _attempt_record(number: int, name: str, ledger_0: dict[str, Any],
                    launch: Optional[records.LauncherAttempt],
                    previous: Optional[dict[str, Any]],
                    launch_before: Optional[records.LauncherAttempt]
                    ) -> dict[str, Any]:
  """One attempt's parts, from its command's start (or the end of the
  attempt before, when the same command ran both) to its end."""
  parts = {p: 0.0 for p in PROCESS_PARTS + JOB_PARTS}
  parts.update(ledger_0['parts'])
  started, ended = ledger_0['started'], ledger_0['updated']
  if launch is not None:
    # The launcher saw the attempt from before the process started to after
    # it ended: that is launch overhead, or the process's unrecorded end.
    ended = max(ended, launch.ended)
    late = ended - ledger_0['updated']
    parts['launch_overhead' if ledger_0['final'] else 'unrecorded'] += late
    parts['launch_overhead'] += max(0.0, started - launch.started)
    moved = min(launch.recreate_s, parts['launch_overhead'])
    parts['launch_overhead'] -= moved
    parts['infrastructure_recovery'] += moved
    started = min(started, launch.started)
  between_commands = 0.0
  if previous is not None and _same_command(launch, launch_before):
    _book_backoff(parts, started - previous['ended'])
    started = previous['ended']
  else:
    command_started = (launch.launcher_started or launch.started
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
  return {'attempt': number, 'name': name, 'started': started,
          'ended': ended, 'wall_s': ended - started, 'final': ledger_0['final'],
          'between_commands_s': between_commands,
          'exit_code': launch.exit_code if launch else None,
          'notes': ledger_0['notes'], 'parts': parts}


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


def roll_up_into_summary(workdir: str) -> dict[str, Any]:
  """Writes WORKDIR/goodput.jsonl and the goodput of WORKDIR/summary.json
  (when it exists) from every ledger and launcher attempt the workdir
  holds; returns the roll-up (`rollup`)."""
  result = write_rollup(workdir)
  path = os.path.join(workdir, 'summary.json')
  if result['goodput'] is not None and os.path.exists(path):
    with open(path) as f:
      record = json.load(f)
    record['goodput'] = summary(result)
    files.write_json(path, record)
  return result


def write_rollup(workdir: str, attempts_path: Optional[str] = None
                 ) -> dict[str, Any]:
  """Writes WORKDIR/goodput.jsonl (one line per attempt) and returns the
  roll-up (see `rollup`; `attempts_path`: the launcher's attempts.jsonl
  where it is not WORKDIR/logs, as for the TPU pod driver's LOG_DIR)."""
  result = rollup(workdir, attempts_path)
  path = os.path.join(workdir, 'goodput.jsonl')
  files.write_atomic(path, ''.join(
      json.dumps({**attempt, 'ranks': result['ranks'][attempt['name']]}) +
      '\n' for attempt in result['attempts']))
  return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
  """The part of a roll-up that goes into summary.json."""
  return {'wall_s': result['wall_s'], 'goodput': result['goodput'],
          'capacity_goodput': result.get('capacity_goodput'),
          'reduced_size_s': result.get('reduced_size_s'),
          'parts': result['parts'], 'attempts': len(result['attempts'])}


class StepClock:
  """Splits the training loop's time among the ledger's categories.

  Each completed step's share of the loop (the time since the previous one,
  less what was taken out meanwhile: compilation, input wait, checkpoints,
  evaluation) goes to 'recomputed' when an earlier attempt had already
  trained that step, else to 'productive'.

  Example:
    >>> clock = StepClock(current(), steps_done_before=120)
    >>> clock.take('input_wait', waited_s)
    >>> clock.step_done(step)
  """

  def __init__(self, ledger: Ledger, steps_done_before: int):
    global _clock
    self.ledger = ledger
    self.steps_done_before = steps_done_before
    self.recomputed_steps = 0
    self._high_water = (HighWater(high_water_path(ledger.path))
                        if ledger.path else None)
    self._mark = time.perf_counter()
    self._taken = 0.0
    self._lock = threading.Lock()
    _clock = self

  def take(self, category: str, seconds: float) -> None:
    self.ledger.add(category, seconds)
    with self._lock:
      self._taken += seconds

  def timing(self, category: str):
    """A context manager that takes its duration out as `category`."""
    return _timed(lambda seconds: self.take(category, seconds))

  def step_done(self, step: int) -> None:
    now = time.perf_counter()
    with self._lock:
      share = now - self._mark - self._taken
      self._mark, self._taken = now, 0.0
    if self._high_water is not None:
      self._high_water.write(step)
    if self.ledger.notes.first_step_wall is None:
      self.ledger.note(first_step_wall=time.time())
    if step <= self.steps_done_before:
      self.recomputed_steps += 1
      self.ledger.add('recomputed', share)
      self.ledger.note(recomputed_steps=self.recomputed_steps)
    else:
      self.ledger.add('productive', share)
      if self.ledger.notes.first_productive is None:
        # What recovery cost, as of the first step that is new work.
        self.ledger.note(first_productive=records.FirstProductive(
            time.time(), step, self.ledger.record(final=False)['parts']))
    self.ledger.note(last_step=step)
    self.ledger.flush()

  def close(self) -> None:
    global _clock
    if _clock is self:
      _clock = None


_clock: Optional[StepClock] = None


def on_compile(seconds: float) -> None:
  """Counts compilation time, out of the running step's share if any."""
  clock = _clock
  if clock is not None:
    clock.take('compile', seconds)
  else:
    _current.add('compile', seconds)
