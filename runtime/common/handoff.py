"""What a launcher tells each process, as one typed value; the only module
that names podrun's environment variables.

A launcher (the local pod, Ray's driver, the TPU driver through its worker
script, a scheduler's script) builds one `Handoff` and puts `env()` into
each process's environment; the process reads it back once
(`Handoff.read`), and `launcher.process` installs it (`use`) before the
workload runs, so the runtime takes its values from `current()`, never
from the environment. launcher/tpu/worker.py runs on a TPU VM without the
project and spells the names it sets itself (tests/test_tpu_worker.py
holds them equal).

`Settings` are a machine's own (where local copies and the record's cache
go), read where they are used.

Example:
  >>> told = Handoff(job_id='j', attempt='j-a1', elastic=(2, 4))
  >>> told.env()
  {'PODRUN_JOB_ID': 'j', 'PODRUN_ATTEMPT': 'j-a1', 'PODRUN_ELASTIC_PROCESSES': '2-4'}
  >>> Handoff.read(told.env()) == told
  True
"""

import dataclasses
import os
from typing import Any, Mapping, Optional

# A scheduler's or a user's way to hand each process its place in the job,
# for --coordinator_address, --num_processes, --process_id and
# --coordinator_bind_address (flags win).
COORDINATOR_ADDRESS = 'PODRUN_COORDINATOR_ADDRESS'
NUM_PROCESSES = 'PODRUN_NUM_PROCESSES'
PROCESS_ID = 'PODRUN_PROCESS_ID'
COORDINATOR_BIND_ADDRESS = 'PODRUN_COORDINATOR_BIND_ADDRESS'
# The job's certificate authority, for --tls_dir (flags win).
TLS_DIR = 'PODRUN_TLS_DIR'
# The job's id, the same on every attempt: names its local checkpoints and
# its workdir lease.
JOB_ID = 'PODRUN_JOB_ID'
# This attempt's name, the same on every process: its goodput ledgers' folder.
ATTEMPT = 'PODRUN_ATTEMPT'
# The process count a TPU driver expects from the accelerator type.
EXPECTED_PROCESSES = 'PODRUN_EXPECTED_PROCESSES'
# "K-P": the fewest and most processes an elastic job may run on
# (--min_processes, --min_slices), so that a config that cannot run on
# one of them is refused before step 1.
ELASTIC_PROCESSES = 'PODRUN_ELASTIC_PROCESSES'
# Set where an elastic job loses and regains whole slices (the TPU driver's
# --min_slices): a replica of sharded state may then be a slice.
ELASTIC_SLICES = 'PODRUN_ELASTIC_SLICES'
# Set by a local-pod launcher: it prefixes, files and filters the process's
# output itself.
SUPERVISED = 'PODRUN_SUPERVISED'
# Set by a launcher that reaches the workdir and writes its own files of
# the record there (the goodput roll-up, its attempts): process 0 then
# leaves them to it (runtime/common/layout.py, `writer`).
LAUNCHER_RECORD = 'PODRUN_LAUNCHER_RECORD'
# The pipe a local-pod launcher reads each process's progress from.
PROGRESS_FD = 'PODRUN_PROGRESS_FD'
# A file the launcher writes when its infrastructure saw processes' hosts
# go (a TPU slice PREEMPTED): JSON {"processes": [...], "why": "..."}. Their
# silence then ends the job within seconds rather than --heartbeat_timeout
# (launcher/process/peers.py).
GONE_FILE = 'PODRUN_GONE_FILE'

# A machine's settings.
# Where the local checkpoint tier lives (default /dev/shm/podrun).
LOCAL_CHECKPOINT_DIR = 'PODRUN_LOCAL_CHECKPOINT_DIR'
# Where a machine keeps its copy of a gs:// workdir (default
# ~/.cache/podrun/record; launcher/common/record_mirror.py).
RECORD_CACHE = 'PODRUN_RECORD_CACHE'
# Seconds between its uploads to the bucket (default 10).
RECORD_UPLOAD_EVERY_S = 'PODRUN_RECORD_UPLOAD_EVERY_S'

# Handoff's field -> its variable.
_VARIABLES = {
    'coordinator_address': COORDINATOR_ADDRESS,
    'coordinator_bind_address': COORDINATOR_BIND_ADDRESS,
    'num_processes': NUM_PROCESSES,
    'process_id': PROCESS_ID,
    'tls_dir': TLS_DIR,
    'job_id': JOB_ID,
    'attempt': ATTEMPT,
    'expected_processes': EXPECTED_PROCESSES,
    'elastic': ELASTIC_PROCESSES,
    'elastic_slices': ELASTIC_SLICES,
    'supervised': SUPERVISED,
    'launcher_record': LAUNCHER_RECORD,
    'progress_fd': PROGRESS_FD,
    'gone_file': GONE_FILE,
}
# Every variable a launcher hands a process: none may be inherited from
# another job (launcher/ray/host.py).
NAMES = tuple(_VARIABLES.values())


class HandoffError(ValueError):
  """A variable of the hand-off holds what it cannot; names it."""


def variable(field: str) -> str:
  """The environment variable of Handoff's `field`, for messages that
  name where a value came from."""
  return _VARIABLES[field]


@dataclasses.dataclass(frozen=True)
class Handoff:
  """What a launcher tells one process of the job; None (or False) where it
  tells nothing.

  Attributes:
    coordinator_address, coordinator_bind_address, num_processes,
      process_id: the process's place, where a launcher or scheduler sets
      it (the launcher's flags win).
    tls_dir: the job's certificate authority (--tls_dir wins).
    job_id: the same on every attempt of the job.
    attempt: this attempt's name, the same on every process.
    expected_processes: the process count a TPU pod's type implies.
    elastic: (fewest, most) processes an elastic job may run on.
    elastic_slices: that job loses and regains whole slices.
    supervised: a local pod's launcher handles the process's output.
    launcher_record: the launcher writes its own files of the record.
    progress_fd: the pipe the launcher reads steps from.
    gone_file: where the launcher says which processes' hosts went.
  """
  coordinator_address: Optional[str] = None
  coordinator_bind_address: Optional[str] = None
  num_processes: Optional[int] = None
  process_id: Optional[int] = None
  tls_dir: Optional[str] = None
  job_id: Optional[str] = None
  attempt: Optional[str] = None
  expected_processes: Optional[int] = None
  elastic: Optional[tuple[int, int]] = None
  elastic_slices: bool = False
  supervised: bool = False
  launcher_record: bool = False
  progress_fd: Optional[int] = None
  gone_file: Optional[str] = None

  def env(self) -> dict[str, str]:
    """{variable: value} of every field told, in the fields' order."""
    out = {}
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if value is None or value is False:
        continue
      if field.name == 'elastic':
        value = '%d-%d' % value
      elif value is True:
        value = '1'
      out[_VARIABLES[field.name]] = str(value)
    return out

  @classmethod
  def read(cls, environ: Mapping[str, str]) -> 'Handoff':
    """The hand-off `environ` holds; an empty variable tells nothing.

    Raises:
      HandoffError: naming a variable whose value is not what it should be.
    """
    told: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
      name = _VARIABLES[field.name]
      value = environ.get(name)
      if value is None or value == '':
        continue
      if field.name in ('supervised', 'launcher_record', 'elastic_slices'):
        told[field.name] = value == '1'
      elif field.name == 'elastic':
        told[field.name] = _range(name, value)
      elif field.name in ('num_processes', 'process_id', 'expected_processes',
                          'progress_fd'):
        told[field.name] = _integer(name, value)
      else:
        told[field.name] = value
    return cls(**told)


def _integer(name: str, value: str) -> int:
  try:
    return int(value)
  except ValueError:
    raise HandoffError(f'{name}={value!r} is not an integer') from None


def _range(name: str, value: str) -> tuple[int, int]:
  fewest, _, most = value.partition('-')
  try:
    pair = int(fewest), int(most)
  except ValueError:
    raise HandoffError(f'{name}={value!r} is not "K-P" (the fewest and most '
                       'processes, K <= P)') from None
  if not 0 < pair[0] <= pair[1]:
    raise HandoffError(f'{name}={value!r}: K={pair[0]} and P={pair[1]} need '
                       '0 < K <= P')
  return pair


@dataclasses.dataclass(frozen=True)
class Settings:
  """A machine's own settings; None for the default.

  Attributes:
    local_checkpoint_dir: where local copies go.
    record_cache: where this machine keeps a bucket's record.
    record_upload_every_s: seconds between uploads of that record.
  """
  local_checkpoint_dir: Optional[str] = None
  record_cache: Optional[str] = None
  record_upload_every_s: Optional[float] = None

  @classmethod
  def read(cls, environ: Optional[Mapping[str, str]] = None) -> 'Settings':
    """The settings `environ` (default os.environ) holds now."""
    environ = os.environ if environ is None else environ
    every = environ.get(RECORD_UPLOAD_EVERY_S)
    try:
      every_s = float(every) if every else None
    except ValueError:
      raise HandoffError(f'{RECORD_UPLOAD_EVERY_S}={every!r} is not a number '
                         'of seconds') from None
    return cls(
        environ.get(LOCAL_CHECKPOINT_DIR) or None,
        environ.get(RECORD_CACHE) or None, every_s)


_installed: Optional[Handoff] = None


def use(told: Optional[Handoff]) -> None:
  """Installs this process's hand-off (launcher.process, once, before the
  workload); None goes back to reading the environment."""
  global _installed
  _installed = told


def current() -> Handoff:
  """This process's hand-off: the one installed, else what the environment
  holds now (a runtime used without podrun's launcher)."""
  return _installed if _installed is not None else Handoff.read(os.environ)
