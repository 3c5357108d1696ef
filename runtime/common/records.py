"""The records that processes and launchers leave for the goodput roll-up.

Each kind is defined once here:

- `LedgerRecord`: a process's goodput ledger
  (WORKDIR/goodput/ATTEMPT/rank_<i>.json), whose `Notes` are the facts it
  keeps beside its seconds: its attempt, how it restored, its first and
  last steps, the fault that ended it;
- `LauncherAttempt`: one line of the launcher's attempts.jsonl per attempt
  it ran (the local pod's WORKDIR/logs, the TPU driver's LOG_DIR);
- `AttemptRow` and `RollUp`: the goodput roll-up over every attempt
  (launcher/common/goodput_rollup.py; WORKDIR/goodput.jsonl, a row a line);
- `Run` and `Summary`: WORKDIR/run.json, process 0's (`write_run`), and
  WORKDIR/summary.json, run.json with the goodput (`with_goodput`);
- `Job`: WORKDIR/logs/job.json, which job ran where, as its launcher says.

The three JSON files others read (ledgers, the roll-up, summary.json) stay
dicts on disk and in memory, typed as TypedDicts: scripts and notebooks
read them with subscripts.

Example:
  >>> notes = Notes.from_json(ledger_record['notes'])
  >>> notes.restore_tier
  'local'
  >>> append_attempt(logs_dir, LauncherAttempt(attempt=1, exit_code=0, ...))
"""

import dataclasses
import json
import os
import signal
import time
from typing import Any, NotRequired, Optional, TypedDict

from runtime.common import exit_codes
from runtime.common import files
from runtime.common import layout


@dataclasses.dataclass(frozen=True)
class Job:
  """WORKDIR/logs/job.json: which job ran where, as its launcher says; the
  same shape from every launcher.

  Attributes:
    job_id: the same on every attempt.
    launched_by: 'podrun' (a local pod), 'podrun-ray' or 'launch_tpu_pod'.
    attempt: the attempt's number (None: the launch as a whole).
    attempt_name: its ledgers' folder (records.attempt_name).
    coordinator_address: where its processes met.
    ranks: each process's {'rank', 'pid', and 'node' or 'command'}.
    exit_code: how the job ended (None while it runs).
    launcher: what else this launcher knows of it (its pid; the Ray
      address; the TPU, zone and slices), written beside the rest.
  """
  job_id: str
  launched_by: str
  attempt: Optional[int] = None
  attempt_name: Optional[str] = None
  coordinator_address: Optional[str] = None
  ranks: tuple[dict[str, Any], ...] = ()
  exit_code: Optional[int] = None
  launcher: dict[str, Any] = dataclasses.field(default_factory=dict)

  def as_json(self) -> dict[str, Any]:
    """The file's object: the fields told, then `launcher`'s."""
    out = {
        f.name: getattr(self, f.name)
        for f in dataclasses.fields(self)
        if f.name != 'launcher' and getattr(self, f.name) is not None
    }
    out['ranks'] = list(self.ranks)
    return {**out, **self.launcher}

  def write(self, path: str) -> None:
    files.write_json(path, self.as_json())


def attempt_name(job_id: str, number: int) -> str:
  """JOB-aN, the one name of attempt `number` (1, 2, ...) of a job: its
  goodput ledgers' folder, its TLS identities, its jobs on TPU workers
  (launcher/tpu/worker.py's base_id reads the job back from it)."""
  return f'{job_id}-a{number}'


@dataclasses.dataclass(frozen=True)
class Fault:
  """A fault that ends an attempt: a process failed, was lost or stalled.

  One type for the one event wherever it is seen: a supervisor publishes it
  to the other processes as why the job ends (launcher/process/end_of_job.py),
  its goodput ledger notes it, a launcher records it in attempts.jsonl, and
  the time to recover starts from it.

  Attributes:
    kind: 'failed', 'lost' or 'stalled' (a supervisor's view), 'aborted'
      or 'killed' (an obituary's: launcher/process/obituary.py, which runs
      without the project's imports and writes these fields itself), or
      'unrecorded' (read from ledgers that all stopped without an end);
      None where a launcher only saw an exit code.
    process_index: the process it is pinned on ('rank' in the files).
    host: that process's host name, where known.
    exit_code: its exit code, for 'failed' and a launcher's view.
    summary: one line: the exception, or what was seen.
    at: wall time of that process's last sign of life (its failure, its
      last heartbeat or step).
    detected: wall time at which the job learned of it (a ledger's or a
      launcher's); None while it is only being told.
  """
  kind: Optional[str] = None
  process_index: Optional[int] = dataclasses.field(default=None,
                                                   metadata={'json': 'rank'})
  host: Optional[str] = None
  exit_code: Optional[int] = None
  summary: Optional[str] = None
  at: float = dataclasses.field(default_factory=time.time)
  detected: Optional[float] = None

  def to_json(self) -> dict[str, Any]:
    return _to_json(self)

  @classmethod
  def from_json(cls, values: Optional[dict[str, Any]]) -> Optional['Fault']:
    return _from_json(cls, values)

  def describe(self) -> str:
    """'rank 1 on HOST failed first: exit 7 (ValueError: ...)' and the like."""
    where = f'rank {self.process_index} on {self.host}'
    if self.kind == 'failed' and self.exit_code in _STOPPED_BY:
      # A Ctrl-C or a scheduler's SIGTERM is someone's decision, not a
      # fault: the others stop with it rather than blame it.
      return (f'{where} was stopped by {_STOPPED_BY[self.exit_code]} (exit '
              f'{self.exit_code}), not by a fault')
    if self.kind == 'failed':
      detail = f' ({self.summary})' if self.summary else ''
      return f'{where} failed first: exit {self.exit_code}{detail}'
    if self.kind == 'lost':
      return f'{where} was lost: {self.summary}'
    return f'{where} stalled: {self.summary}'


_STOPPED_BY = {
    exit_codes.SIGNAL_BASE + signal.SIGINT: 'SIGINT (Ctrl-C)',
    exit_codes.SIGNAL_BASE + signal.SIGTERM: 'SIGTERM'
}


@dataclasses.dataclass(frozen=True)
class FirstProductive:
  """A step of the attempt (its first, or its first that was new work) and
  its ledger then: its parts, and what of its 'other' had a name (None in
  older ledgers)."""
  wall: float
  step: int
  parts: dict[str, float]
  other_named: Optional[dict[str, float]] = None


@dataclasses.dataclass(frozen=True)
class Recreate:
  """A lost TPU slice deleted and created again before an attempt."""
  lost: str
  began: float
  recreate_requested: float
  up: float
  ready: float
  seconds: float


def _from_json(cls, values: Optional[dict[str, Any]]):
  """`cls` from a JSON dict (a field's name in the files is its metadata's
  'json', where it has one), ignoring keys it does not know; None for
  anything but a dict."""
  if not isinstance(values, dict):
    return None
  names = {
      f.metadata.get('json', f.name): f.name for f in dataclasses.fields(cls)
  }
  return cls(**{names[k]: v for k, v in values.items() if k in names})


def _to_json(record) -> dict[str, Any]:
  """The record as a JSON dict, nested records too, without the fields that
  are None."""
  out = {}
  for field in dataclasses.fields(record):
    value = getattr(record, field.name)
    if value is None:
      continue
    if dataclasses.is_dataclass(value):
      value = _to_json(value)
    out[field.metadata.get('json', field.name)] = value
  return out


@dataclasses.dataclass
class Notes:
  """What a process's ledger notes beside its seconds (all optional).

  Attributes:
    attempt: the attempt's name, the same on every process.
    process_index: this process.
    restore_tier, restore_step: where the run resumed from.
    first_step_wall: wall time of the first completed step.
    first_step: the ledger as of that step (a restart's phases).
    first_productive: the first step that was new work.
    recomputed_steps: steps an earlier attempt had already trained.
    last_step: the last step completed.
    compile_cache_hits: programs read from the persistent cache.
    fault: what ended the attempt, as this process learned it.
    exit_code: what this process exited with.
    cause: how it ended, when it could not say so itself (written by its
      obituary, launcher/process/obituary.py: aborted, killed ...).
    topology: what computed the attempt's steps: num_processes,
      num_devices, microbatches.
    restore_bytes, restore_s: what the restore read, and in how long.
    local_interval: how the local tier's default cadence chose its
      interval (runtime/checkpoints/local_cadence.py `Interval.as_dict`).
  """
  attempt: Optional[str] = None
  process_index: Optional[int] = None
  restore_tier: Optional[str] = None
  restore_step: Optional[int] = None
  first_step_wall: Optional[float] = None
  first_step: Optional[FirstProductive] = None
  first_productive: Optional[FirstProductive] = None
  recomputed_steps: Optional[int] = None
  last_step: Optional[int] = None
  compile_cache_hits: Optional[int] = None
  fault: Optional[Fault] = None
  exit_code: Optional[int] = None
  cause: Optional[str] = None
  topology: Optional[dict[str, int]] = None
  restore_bytes: Optional[int] = None
  restore_s: Optional[float] = None
  local_interval: Optional[dict[str, Any]] = None

  def to_json(self) -> dict[str, Any]:
    return _to_json(self)

  @classmethod
  def from_json(cls, values: Optional[dict[str, Any]]) -> 'Notes':
    notes = _from_json(cls, values or {})
    notes.fault = _from_json(Fault, (values or {}).get('fault'))
    notes.first_productive = _from_json(FirstProductive,
                                        (values or {}).get('first_productive'))
    notes.first_step = _from_json(FirstProductive, (values or
                                                    {}).get('first_step'))
    return notes


@dataclasses.dataclass(frozen=True)
class LauncherAttempt:
  """One attempt as the launcher that ran it saw it.

  Every field may be missing from a file an older launcher wrote.

  Attributes:
    started, ended: wall times of the attempt's launch and end.
    attempt: its number, from 1.
    exit_code: the job's exit code.
    kind: how restart.kind_of judged it ('ok', 'preempted', ...).
    name: the attempt's name (its ledgers' folder), if the launcher gave it.
    launcher_started: wall time at which the launcher process started.
    launcher_signalled: the launcher itself got SIGINT or SIGTERM.
    fault: when the failed process died and the launcher noticed.
    infrastructure: a lost slice brought back before this attempt.
    resize: 'shrink' or 'grow' when the next attempt runs on fewer or more
      processes because of how this one ended (an elastic job).
    processes: how many processes this attempt ran.
  """
  started: Optional[float] = None
  ended: Optional[float] = None
  attempt: Optional[int] = None
  exit_code: Optional[int] = None
  kind: Optional[str] = None
  name: Optional[str] = None
  launcher_started: Optional[float] = None
  launcher_signalled: bool = False
  fault: Optional[Fault] = None
  infrastructure: Optional[Recreate] = None
  resize: Optional[str] = None
  processes: Optional[int] = None

  @property
  def recreate_s(self) -> float:
    return self.infrastructure.seconds if self.infrastructure else 0.0

  def to_json(self) -> dict[str, Any]:
    return _to_json(self)

  @classmethod
  def from_json(cls, values: dict[str, Any]) -> 'LauncherAttempt':
    record = _from_json(cls, values)
    return dataclasses.replace(record,
                               fault=_from_json(Fault, values.get('fault')),
                               infrastructure=_from_json(
                                   Recreate, values.get('infrastructure')))


def as_attempt(record) -> Optional[LauncherAttempt]:
  """A LauncherAttempt from one, or from its JSON dict; None stays None."""
  if record is None or isinstance(record, LauncherAttempt):
    return record
  return LauncherAttempt.from_json(record)


def append_attempt(logs_dir: str, attempt: LauncherAttempt) -> None:
  """Adds `attempt` as a line of LOGS_DIR/attempts.jsonl."""
  os.makedirs(logs_dir, exist_ok=True)
  with open(os.path.join(logs_dir, layout.ATTEMPTS), 'a') as f:
    f.write(json.dumps(attempt.to_json()) + '\n')


def read_attempts(path: str) -> list[LauncherAttempt]:
  """Every attempt of an attempts.jsonl; [] when it is missing or broken."""
  try:
    with open(path) as f:
      return [LauncherAttempt.from_json(json.loads(l)) for l in f if l.strip()]
  except (OSError, ValueError, TypeError):
    return []


class LedgerRecord(TypedDict):
  """A process's goodput ledger, as goodput.Ledger.record writes it.

  Keys:
    started: wall time the process started (its /proc start, when known).
    updated: wall time of this write.
    final: whether the process wrote it at its end.
    parts: {category: seconds} (goodput.PROCESS_PARTS).
    other_named: {name: seconds} of what in parts['other'] has a name
      (goodput.OTHER_NAMES); absent in ledgers of older versions.
    notes: Notes.to_json().
  """
  started: float
  updated: float
  final: bool
  parts: dict[str, float]
  other_named: NotRequired[dict[str, float]]
  notes: dict[str, Any]


class AttemptRow(TypedDict, total=False):
  """One attempt of the roll-up, seen through process 0's ledger.

  Keys:
    attempt: its number in the roll-up, from 1.
    name: its ledgers' folder.
    started, ended, wall_s: its span, from its command's start (or the end
      of the attempt before, when one command ran both) to its end.
    final: whether process 0's ledger was written at its end.
    between_commands_s: time before it when no command ran the job.
    exit_code: the launcher's, when one recorded the attempt.
    notes: process 0's Notes.to_json().
    parts: {category: seconds}, adding up to wall_s.
    other_named: what of process 0's parts['other'] has a name.
    recovery: the time to recover from the attempt before (from the
      second attempt on; launcher/common/time_to_recover.py).
    ranks: {process index: parts} (the lines of goodput.jsonl only).
  """
  attempt: int
  name: str
  started: float
  ended: float
  wall_s: float
  final: bool
  between_commands_s: float
  exit_code: Optional[int]
  notes: dict[str, Any]
  parts: dict[str, float]
  other_named: dict[str, float]
  recovery: Optional[dict[str, Any]]
  ranks: dict[int, dict[str, float]]


class RollUp(TypedDict):
  """The job's goodput over every attempt (goodput_rollup.rollup).

  Keys:
    wall_s: the job's wall time, less the time between commands.
    goodput: productive seconds over wall_s; None when nothing ran.
    between_commands_s: the time no command ran the job.
    full_devices, reduced_size_s, capacity_goodput: the job weighed by the
      devices each attempt ran on (None without topology notes).
    parts: {category: seconds} over every attempt.
    attempts: a row an attempt.
    ranks: {attempt name: {process index: parts}}.
  """
  wall_s: float
  goodput: Optional[float]
  between_commands_s: float
  full_devices: Optional[int]
  reduced_size_s: Optional[float]
  capacity_goodput: Optional[float]
  parts: dict[str, float]
  attempts: list[AttemptRow]
  ranks: dict[str, dict[int, dict[str, float]]]


class SummaryGoodput(TypedDict):
  """summary.json's 'goodput': the roll-up's totals."""
  wall_s: float
  goodput: Optional[float]
  capacity_goodput: Optional[float]
  reduced_size_s: Optional[float]
  parts: dict[str, float]
  attempts: int


class Run(TypedDict, total=False):
  """WORKDIR/run.json, process 0's: what the run that finished ran on and
  computed.

  Keys:
    podrun_version: the podrun that ran it (runtime/common/version.py).
    workload, steps, global_batch_size: from the config.
    process_count, device_count, local_device_count, platform,
      device_kind: the topology of the attempt that finished.
    final_metrics: the last step's metrics.
    ranks: each process's supervision figures (peers.rank_stats).
    results: the workload's TrainResult.summary(), or its own dict.
    gpu: on a GPU host, process 0's GPUs, local_device_ids, memory
      fraction and the preset's variables (launcher/process/gpu_host.py).
  """
  podrun_version: str
  workload: str
  steps: Optional[int]
  global_batch_size: Optional[int]
  process_count: int
  device_count: int
  local_device_count: int
  platform: str
  device_kind: str
  final_metrics: Optional[dict[str, float]]
  ranks: list[dict[str, Any]]
  results: Any
  gpu: dict[str, Any]


class Summary(Run, total=False):
  """WORKDIR/summary.json, the launcher's (process 0's where no launcher
  writes the record: layout.writer): run.json and the goodput over every
  attempt (SummaryGoodput)."""
  goodput: SummaryGoodput


def write_run(record: layout.Record, run: Run) -> str:
  """Writes WORKDIR/run.json whole (process 0, at the end of a run that
  trained); returns its path."""
  path = record.run()
  files.write_json(path, run)
  return path


def with_goodput(record: layout.Record,
                 goodput: SummaryGoodput) -> Optional[Summary]:
  """Writes WORKDIR/summary.json: run.json with `goodput`; None (and nothing
  written) where no run finished to write run.json."""
  try:
    with open(record.run()) as f:
      run: Run = json.load(f)
  except FileNotFoundError:
    return None
  summary: Summary = {**run, 'goodput': goodput}
  files.write_json(record.summary(), summary)
  return summary
