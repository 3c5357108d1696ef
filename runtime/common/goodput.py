"""Where a job's wall-clock time went: a ledger per process and attempt.

Every process of every attempt keeps a `Ledger` of seconds per category and
rewrites it, whole, to WORKDIR/goodput/ATTEMPT/rank_<i>.json every few
seconds and when it ends. The launcher's side reads them back
(launcher/common/goodput_rollup.py, with the launcher's
WORKDIR/logs/attempts.jsonl when a launcher restarted the job) and accounts
for the job's whole wall time:

- per process: `startup` (process start, imports, config, devices),
  `distributed_init`, `checkpoint_restore`, `compile` (the seconds JAX's
  own compilation and compilation-cache events report, wherever they
  happen, taken out of the step that paid for them: `on_compile`),
  `productive` (the rest of every step), `recomputed` (steps an earlier attempt
  had already trained: lost work), `input_wait`, `checkpoint_blocking`,
  `evaluation`, `preemption_save`, and `other` (the rest of the process's
  life), whose pieces are named in the ledger's `other_named`
  (OTHER_NAMES: the record's fetch, the agreement, the lease, the
  workload's own set-up before runtime.train, a step cut short, ...), so
  that what is left unnamed is small;
- per job: `unrecorded` (the end of an attempt that was killed before it
  could write its ledger: its last seconds are lost, not dropped),
  `launch_overhead` (the launcher starting and reaping the processes) and
  `restart_backoff` (a launcher waiting between two attempts it ran).
  The time between two commands (a Ctrl-C, then the same command again an
  hour later) is no part: it is reported as `between_commands_s`, outside
  the job's wall time.

Goodput = productive / wall time. Nothing here imports JAX.

Which steps are recomputed is exact however an attempt ended: every process
stores the last step it completed in an 8-byte memory-mapped file beside its
ledger (`HighWater`), which survives a SIGKILL. Each attempt after a failure
also gets its time to recover (launcher/common/time_to_recover.py): from the
fault to its first productive step, split into detection, teardown,
back-off, start-up, distributed init, restore (with the tier it came from),
compile and recomputed steps.

Example:
  >>> ledger = Ledger(process_start=time.time())
  >>> with ledger.timing('checkpoint_restore'):
  ...   restore()
  >>> goodput_rollup.rollup('/runs/mnist')['goodput']
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
from typing import Any, Callable, ContextManager, Iterator, Mapping, Optional

from runtime.common import exit_codes
from runtime.common import files
from runtime.common import layout
from runtime.common import records

PROCESS_PARTS = ('startup', 'distributed_init', 'checkpoint_restore', 'compile',
                 'productive', 'recomputed', 'input_wait',
                 'checkpoint_blocking', 'evaluation', 'preemption_save',
                 'other')
# infrastructure_recovery: bringing machines back before an attempt could
# start (a TPU slice deleted and created again after a preemption).
JOB_PARTS = ('unrecorded', 'launch_overhead', 'restart_backoff',
             'infrastructure_recovery')
# The named pieces of 'other', in the order a process meets them.
OTHER_NAMES = ('backend_start', 'record_fetch', 'stall_history',
               'compilation_cache', 'agreement', 'lease', 'workload_import',
               'credentials', 'workload_setup', 'train_setup', 'metrics_writer',
               'replicate', 'eval_check', 'loop_end', 'results', 'summary')
_FLUSH_EVERY_S = 2.0

# Set by scripts/run.sh as `PID:WALL TIME` just before it execs Python in
# its own process: the kernel's start time is then the script's, which may
# have spent a minute installing first.
EXEC_VARIABLE = 'PODRUN_EXEC'


def _exec_time(env: Mapping[str, str], pid: int) -> Optional[float]:
  """When a script exec'd this very process into Python, from EXEC_VARIABLE;
  None where it is unset, malformed or another process's."""
  told = env.get(EXEC_VARIABLE, '')
  told_pid, _, at = told.partition(':')
  try:
    return float(at) if int(told_pid) == pid else None
  except ValueError:
    return None


def process_start_time(env: Optional[Mapping[str, str]] = None) -> float:
  """Wall time at which this process started (Linux), else now; where a
  script exec'd it into Python (EXEC_VARIABLE), when it did."""
  execed = _exec_time(os.environ if env is None else env, os.getpid())
  if execed is not None:
    return execed
  try:
    with open('/proc/self/stat') as f:
      ticks = int(f.read().rsplit(')', 1)[1].split()[19])
    with open('/proc/uptime') as f:
      uptime = float(f.read().split()[0])
    # /proc/stat's boot time is whole seconds; the uptime is finer.
    return time.time() - (uptime - ticks / os.sysconf('SC_CLK_TCK'))
  except (OSError, ValueError, IndexError):
    return time.time()


class Ledger:
  """Seconds per category for one process of one attempt.

  Categories are PROCESS_PARTS; 'other' is never added to: it is whatever
  of the process's life the others do not cover.
  """

  def __init__(self, process_start: Optional[float] = None):
    self.started = process_start if process_start else process_start_time()
    self.parts = {p: 0.0 for p in PROCESS_PARTS if p != 'other'}
    # What of 'other' has a name: {one of OTHER_NAMES: seconds}.
    self.other_named: dict[str, float] = {}
    # name -> (perf_counter, the parts' total) when it was marked.
    self._marks: dict[str, tuple[float, float]] = {}
    self.notes = records.Notes()
    self.path: Optional[str] = None
    # The step clock running over this ledger, if any (StepClock sets it):
    # compilation comes out of its running step.
    self.clock: Optional['StepClock'] = None
    self._lock = threading.Lock()
    self._last_flush = 0.0

  def add(self, category: str, seconds: float) -> None:
    if category not in self.parts:
      raise ValueError(f'unknown goodput category {category!r}; one of '
                       f'{", ".join(self.parts)}')
    with self._lock:
      self.parts[category] += max(0.0, seconds)

  @contextlib.contextmanager
  def _own_seconds(self, record: Callable[[float], None]) -> Iterator[None]:
    """Hands `record` the block's seconds less what other parts took
    meanwhile (a compilation it triggered), so that a second counts once."""
    parts_before = self._parts_total()
    started = time.perf_counter()
    try:
      yield
    finally:
      meanwhile = self._parts_total() - parts_before
      record(max(0.0, time.perf_counter() - started - meanwhile))

  def timing(self, category: str) -> ContextManager[None]:
    """A context manager that adds its duration to `category`, less what
    other parts took meanwhile (a compilation the restore triggered)."""
    return self._own_seconds(lambda seconds: self.add(category, seconds))

  def naming(self, name: str) -> ContextManager[None]:
    """A context manager whose duration stays in 'other', named `name`
    there (one of OTHER_NAMES), less what other parts took meanwhile."""
    return self._own_seconds(lambda seconds: self.name_other(name, seconds))

  def _parts_total(self) -> float:
    with self._lock:
      return sum(self.parts.values())

  def name_other(self, name: str, seconds: float) -> None:
    if name not in OTHER_NAMES:
      raise ValueError(f'unknown name {name!r} for a piece of other; one of '
                       f'{", ".join(OTHER_NAMES)}')
    with self._lock:
      self.other_named[name] = self.other_named.get(name, 0.0) + max(
          0.0, seconds)

  def mark(self, name: str) -> None:
    """Notes now, for `name_since`: where a piece begins in one module and
    ends in another (the workload's own set-up, up to runtime.train)."""
    self._marks[name] = (time.perf_counter(), self._parts_total())

  def name_since(self, mark: str, name: str) -> None:
    """Names the time since `mark(mark)` as `name`, less what other parts
    took meanwhile (as `naming`); nothing without the mark."""
    found = self._marks.pop(mark, None)
    if found is not None:
      started, parts_before = found
      self.name_other(
          name,
          time.perf_counter() - started - (self._parts_total() - parts_before))

  def note(self, **values: Any) -> None:
    """Sets fields of `notes` (records.Notes); an unknown name raises."""
    with self._lock:
      for name, value in values.items():
        if not hasattr(self.notes, name):
          raise TypeError(f'the goodput ledger has no note {name!r}; see '
                          'runtime/common/records.py Notes')
        setattr(self.notes, name, value)

  def record(self, final: bool) -> records.LedgerRecord:
    now = time.time()
    clock = self.clock
    if final and clock is not None:
      # The process ends inside the loop (a peer's failure, a signal): the
      # step under way is its loop's end.
      clock.close()
    with self._lock:
      parts = dict(self.parts)
      named = dict(self.other_named)
      notes = self.notes.to_json()
    parts['other'] = max(0.0, now - self.started - sum(parts.values()))
    return {
        'started': self.started,
        'updated': now,
        'final': final,
        'parts': parts,
        'other_named': named,
        'notes': notes
    }

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


class _ThisProcess:
  """This process's ledger: the one `current` returns (one that writes
  nowhere until `open_ledger` gives it a file)."""

  def __init__(self):
    self.ledger = Ledger(process_start=time.time())


_this = _ThisProcess()


def current() -> Ledger:
  """This process's ledger (one that writes nowhere until `open_ledger`)."""
  return _this.ledger


def use(ledger: Ledger) -> None:
  """Makes `ledger` this process's, before it has a file to write to."""
  _this.ledger = ledger


def open_ledger(ledger: Ledger, record: layout.Record, attempt: str,
                process_index: int) -> None:
  """Makes `ledger` this process's, writing to WORKDIR/goodput/ATTEMPT."""
  ledger.path = record.ledger(attempt, process_index)
  ledger.note(attempt=attempt, process_index=process_index)
  _this.ledger = ledger
  ledger.flush(force=True)


def ledger_of_a_start_cut_short(attempt: str, process_index: int,
                                started: float, ended: float,
                                exit_code: int) -> records.LedgerRecord:
  """The ledger of a process that ended before it opened its own (killed
  during its start-up: before jax.distributed gave it the attempt), as its
  launcher writes it: all of its time start-up, and its end.

  Example:
    >>> ledger_of_a_start_cut_short('job-a2', 0, 100.0, 100.5, 137)['parts']
    {'startup': 0.5, 'distributed_init': 0.0, ...}
  """
  parts = {name: 0.0 for name in PROCESS_PARTS}
  parts['startup'] = max(0.0, ended - started)
  return {
      'started': started,
      'updated': ended,
      'final': False,
      'parts': parts,
      'other_named': {},
      'notes': {
          'attempt': attempt,
          'process_index': process_index,
          'exit_code': exit_code,
          'cause': f'ended during its start-up, before its own '
                   f'ledger: exit {exit_code}'
                   f'{exit_codes.signal_suffix(exit_code)}'
      }
  }


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


def steps_done_before(ledger: Ledger) -> int:
  """The furthest step any process of an earlier attempt of the job
  completed (0 when the ledger writes nowhere)."""
  if ledger.path is None:
    return 0
  this_attempt = os.path.dirname(ledger.path)
  furthest = 0
  for attempt in glob.glob(os.path.join(os.path.dirname(this_attempt), '*')):
    if attempt == this_attempt:
      continue
    for path in layout.ranks(attempt, '.step').values():
      furthest = max(furthest, HighWater.read(path))
    for path in layout.ranks(attempt).values():
      try:
        with open(path) as f:
          notes = records.Notes.from_json(json.load(f).get('notes'))
        furthest = max(furthest, notes.last_step or 0)
      except (OSError, ValueError, KeyError):
        continue
  return furthest


# Exit codes of a process that died of a signal no one chose to send: an
# abort (134), a bus error (135), SIGKILL (137: the OOM killer, a host's
# end), a segmentation fault (139). Not a Ctrl-C (130) or a SIGTERM (143).
_HARD_FAILURES = tuple(exit_codes.SIGNAL_BASE + n for n in (6, 7, 9, 11))


def failure_history(ledger: Ledger) -> tuple[int, float]:
  """(hard failures, seconds run) of the job's earlier attempts, from
  process 0's ledgers: an attempt that ended by a signal (its obituary
  writes 137 for a SIGKILL, 134 for an abort) or whose ledger holds no end
  and no exit code (lost with its host) failed hard; the seconds are each attempt's,
  from its start to its ledger's last write. (0, 0.0) when the ledger
  writes nowhere."""
  if ledger.path is None:
    return 0, 0.0
  this_attempt = os.path.dirname(ledger.path)
  return failures_in(os.path.dirname(this_attempt),
                     os.path.basename(this_attempt))


def failures_in(ledgers: str, skip: str = '') -> tuple[int, float]:
  """`failure_history` of the attempts under `ledgers` (WORKDIR/goodput)
  but `skip`."""
  failures, seconds = 0, 0.0
  for attempt in glob.glob(os.path.join(glob.escape(ledgers), '*')):
    path = layout.rank_file(attempt, 0)
    if os.path.basename(attempt) == skip or not os.path.exists(path):
      continue
    try:
      with open(path) as f:
        found = json.load(f)
      seconds += max(0.0, found['updated'] - found['started'])
    except (OSError, ValueError, KeyError, TypeError):
      continue
    code = (found.get('notes') or {}).get('exit_code')
    failures += code in _HARD_FAILURES or (code is None and
                                           not found.get('final'))
  return failures, seconds


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

  def __init__(self,
               ledger: Ledger,
               steps_done_before: int,
               compiled_here: Callable[[], float] = lambda: 0.0):
    self.ledger = ledger
    self.steps_done_before = steps_done_before
    # The loop's own pauses (`timing`), less the compiles inside them,
    # which compiled_here (this thread's compile seconds) counts.
    self.paused_s = 0.0
    self._compiled_here = compiled_here
    self.recomputed_steps = 0
    self._high_water = (HighWater(layout.high_water(ledger.path))
                        if ledger.path else None)
    self._mark = time.perf_counter()
    self._taken = 0.0
    self._lock = threading.Lock()
    ledger.clock = self

  def take(self, category: str, seconds: float) -> None:
    self.ledger.add(category, seconds)
    with self._lock:
      self._taken += seconds

  @contextlib.contextmanager
  def timing(self, category: str) -> Iterator[None]:
    """A context manager that takes its duration out as `category`, less
    this thread's compiles inside it: on_compile took those as 'compile'
    already, and taking them twice shrank the step's share ('productive')
    by as much. The loop's thread pauses meanwhile (`paused_s`)."""
    started, compiled = time.perf_counter(), self._compiled_here()
    try:
      yield
    finally:
      outside = max(
          0.0,
          time.perf_counter() - started - (self._compiled_here() - compiled))
      self.take(category, outside)
      self.paused_s += outside

  def paused_here(self) -> float:
    """Seconds the loop's thread spent outside its steps so far: its
    pauses and its compiles (a difference of two readings is what a span
    held)."""
    return self.paused_s + self._compiled_here()

  def step_done(self, step: int, steps: int = 1) -> None:
    """Steps `step - steps + 1` .. `step` completed (one call's): the loop's
    time since the last call splits between 'recomputed' and 'productive'
    by how many of them an earlier attempt had trained."""
    now = time.perf_counter()
    with self._lock:
      share = now - self._mark - self._taken
      self._mark, self._taken = now, 0.0
    first = step - steps + 1
    if self._high_water is not None:
      self._high_water.write(step)
    if self.ledger.notes.first_step_wall is None:
      # Where the time to the first step went: a restart's phases.
      self.ledger.note(first_step_wall=time.time(),
                       first_step=self._snapshot(first))
    recomputed = max(0, min(step, self.steps_done_before) - first + 1)
    if recomputed:
      self.recomputed_steps += recomputed
      self.ledger.add('recomputed', share * recomputed / steps)
      self.ledger.note(recomputed_steps=self.recomputed_steps)
    if recomputed < steps:
      self.ledger.add('productive', share * (steps - recomputed) / steps)
      if self.ledger.notes.first_productive is None:
        # What recovery cost, as of the first step that is new work.
        self.ledger.note(first_productive=self._snapshot(first + recomputed))
    self.ledger.note(last_step=step)
    self.ledger.flush()

  def _snapshot(self, step: int) -> records.FirstProductive:
    """The ledger as of `step`, just completed."""
    now_record = self.ledger.record(final=False)
    return records.FirstProductive(time.time(), step, now_record['parts'],
                                   now_record['other_named'])

  def close(self) -> None:
    """The loop ended. Its time since the last completed step (a step cut
    short by a failure or a notice, or the loop's last bookkeeping) trained
    nothing: it stays in 'other', named 'loop_end'."""
    if self.ledger.clock is self:
      self.ledger.clock = None
      with self._lock:
        rest = time.perf_counter() - self._mark - self._taken
      self.ledger.name_other('loop_end', rest)


def on_compile(seconds: float) -> None:
  """Counts compilation time into this process's ledger, out of the
  running step's share if a step clock runs over it."""
  ledger = _this.ledger
  clock = ledger.clock
  if clock is not None:
    clock.take('compile', seconds)
  else:
    ledger.add('compile', seconds)
