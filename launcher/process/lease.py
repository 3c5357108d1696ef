"""One job per workdir: a lease file that the running job keeps renewing.

Two jobs writing one checkpoint directory destroy each other's checkpoints
(orbax's temporary directories collide, a resume reads a half-written step).
A requeued SLURM job, a retried Kubernetes pod or a second terminal does
exactly that. So process 0 of a job takes a lease, `.podrun_lease.json`, in
its workdir and in its checkpoint directory before anything is written, and
renews it every few seconds:

- a lease held by another job and renewed recently stops the new job before
  it touches anything, naming the holder (host, pid, job id, since when);
- a lease not renewed for `stale_after_s` (its holder died without
  releasing it), or whose holder's process no longer runs on this very
  host, is taken over with a warning;
- a lease of the same job id (a restart of this very job) is taken over at
  once;
- a clean exit releases it.

Creation is exclusive on a local or shared POSIX file system (O_EXCL) and
in a gs:// bucket, where every change is conditional on the object's
generation (launcher/process/lease_object.py): of two jobs started at once
exactly one creates it; a takeover deletes the generation it read, on
condition that it is still that one, then creates afresh, so of two takers
of one stale lease the second finds it changed and backs off; a renewal
writes over the generation this job wrote last, never over a taker's; a
release deletes only that generation; a lease that exists but cannot be
read is refused, never taken for absent. Elsewhere (other object stores)
the taker writes, waits a moment and reads back.
"""

import dataclasses
import json
import os
import socket
import threading
import time
import uuid
from typing import Callable, Optional

from absl import logging
from etils import epath

from launcher.common import cluster
from launcher.process import lease_object
from runtime.common import exit_codes
from runtime.common import files
from runtime.common import layout
from runtime import coordination

_SETTLE_S = 1.0


class WorkdirBusyError(exit_codes.PodrunError, RuntimeError):
  """Another live job holds the lease on a directory this job would use."""
  exit_code = exit_codes.WORKDIR_BUSY


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a lease. Times are seconds since the epoch."""
  job_id: str
  host: str
  pid: int
  since: float
  renewed: float
  token: str

  def describe(self) -> str:
    return (f'job {self.job_id} (host {self.host}, pid {self.pid}, since '
            f'{_utc(self.since)}, last renewed {_utc(self.renewed)})')


def _utc(t: float) -> str:
  return time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(t))


def _launcher_alive(pid: int) -> bool:
  """Whether `pid` runs a launcher on this host (a recycled pid does not)."""
  if pid == os.getpid():
    return True
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      return b'launcher' in f.read()
  except OSError:
    return False


def _is_local(path: str) -> bool:
  return '://' not in path


def _read(path: epath.Path) -> Optional[Holder]:
  try:
    return Holder(**json.loads(path.read_text()))
  except (FileNotFoundError, OSError, ValueError, TypeError):
    return None


def _create_exclusive(path: epath.Path, holder: Holder) -> bool:
  """Creates the lease file on a POSIX file system; False if it exists."""
  try:
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, 'w') as f:
    f.write(json.dumps(dataclasses.asdict(holder)))
  return True


def _in_bucket(path: epath.Path) -> bool:
  return str(path).startswith('gs://')


def _bucket_read(path: epath.Path) -> Optional[tuple[Holder, int]]:
  """The bucket's lease and its generation, or None when there is none.

  Raises:
    WorkdirBusyError: for a lease that exists but cannot be read or is not
      a lease: it may be held, so it is never taken for absent.
  """
  try:
    found = lease_object.read(str(path))
  except lease_object.Unreadable as e:
    raise WorkdirBusyError(
        f'{path.parent} holds a lease this job cannot read ({e}), so it '
        'cannot tell whether another job holds it; this job stops without '
        f'touching it. Delete {path} only if you are sure no job uses '
        f'{path.parent}.') from e
  if found is None:
    return None
  content, generation = found
  try:
    return Holder(**content), generation
  except TypeError as e:
    raise WorkdirBusyError(
        f'{path.parent} holds {path}, which is not a podrun lease '
        f'({sorted(content)}); this job stops without touching it.') from e


def _encoded(holder: Holder) -> bytes:
  return json.dumps(dataclasses.asdict(holder)).encode()


def _write(path: epath.Path, holder: Holder) -> None:
  """Replaces the lease file whole, so that readers never see half of it."""
  text = json.dumps(dataclasses.asdict(holder))
  if not _is_local(str(path)):
    path.write_text(text)
    return
  files.write_atomic(str(path), text)


class Lease:
  """The leases of one job on its directories.

  Example:
    >>> lease = Lease(['/runs/a', '/runs/a/checkpoints'], job_id='x')
    >>> lease.acquire()   # raises WorkdirBusyError when another job holds one
    >>> ...
    >>> lease.release()
  """

  def __init__(self,
               directories: list[str],
               job_id: str,
               stale_after_s: float = 60,
               renew_every_s: float = 10,
               on_lost: Optional[Callable[[str], None]] = None,
               clock: Callable[[], float] = time.time):
    self.paths = [
        epath.Path(d) / layout.LEASE for d in dict.fromkeys(directories)
    ]
    self.stale_after_s = stale_after_s
    self.renew_every_s = renew_every_s
    self._on_lost = on_lost
    self._clock = clock
    now = clock()
    self.holder = Holder(job_id, socket.gethostname(), os.getpid(), now, now,
                         uuid.uuid4().hex)
    self._held: list[epath.Path] = []
    # A bucket's lease: the generation this job wrote last.
    self._generations: dict[str, int] = {}
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def acquire(self) -> None:
    """Takes every lease, or none.

    Raises:
      WorkdirBusyError: naming the directory and the job that holds it.
    """
    try:
      for path in self.paths:
        self._take(path)
        self._held.append(path)
    except BaseException:
      self.release()
      raise
    self._thread = threading.Thread(target=self._renew_loop,
                                    daemon=True,
                                    name='podrun-lease')
    self._thread.start()

  def _take(self, path: epath.Path) -> None:
    if _in_bucket(path):
      self._take_in_bucket(path)
      return
    path.parent.mkdir(parents=True, exist_ok=True)
    local = _is_local(str(path))
    if local and _create_exclusive(path, self.holder):
      return
    current = _read(path)
    if current is not None:
      self._check_takeover(path, current)
    _write(path, self.holder)
    # Of two jobs taking the same lease at once, the later write wins: let
    # it land, then look whose token is there.
    time.sleep(_SETTLE_S if not local else _SETTLE_S / 5)
    current = _read(path)
    if current is None or current.token != self.holder.token:
      raise WorkdirBusyError(
          f'{path.parent} was taken by '
          f'{current.describe() if current else "another job"} at the same '
          'moment; this job stops without touching it.')

  def _take_in_bucket(self, path: epath.Path) -> None:
    """Creates the lease object, or takes over one that may be taken, with
    preconditions only (launcher/process/lease_object.py): no read-then-write
    window."""
    url = str(path)
    try:
      self._generations[url] = lease_object.create(url, _encoded(self.holder))
      return
    except lease_object.Changed:
      pass
    found = _bucket_read(path)
    if found is not None:
      self._check_takeover(path, found[0])
    try:
      if found is not None and not lease_object.delete(url, found[1]):
        raise lease_object.Changed(url)
      self._generations[url] = lease_object.create(url, _encoded(self.holder))
    except lease_object.Changed:
      now = _bucket_read(path)
      raise WorkdirBusyError(
          f'{path.parent} was taken by '
          f'{now[0].describe() if now else "another job"} at the same '
          'moment; this job stops without touching it.') from None

  def _check_takeover(self, path: epath.Path, current: Holder) -> None:
    age = self._clock() - current.renewed
    if current.job_id == self.holder.job_id:
      logging.info(
          'taking over the lease on %s from an earlier attempt of '
          'job %s', path.parent, current.job_id)
      return
    if current.host == self.holder.host and not _launcher_alive(current.pid):
      logging.warning(
          'taking over the lease on %s from %s: its process no '
          'longer runs on this host', path.parent, current.describe())
      return
    if age <= self.stale_after_s:
      raise WorkdirBusyError(
          f'{path.parent} is in use by {current.describe()}, renewed '
          f'{age:.0f} s ago. Two jobs on one workdir or checkpoint directory '
          'would overwrite each other\'s checkpoints, so this job stops '
          'before touching anything. Wait for that job to end, stop it, or '
          'use another --workdir (or config.checkpoint_dir). A lease not '
          f'renewed for {self.stale_after_s:g} s (--lease_timeout) is taken '
          f'over; delete {path} only if you are sure that job is gone.')
    logging.warning(
        'taking over the lease on %s from %s: not renewed for '
        '%.0f s (--lease_timeout=%g), so that job is taken for '
        'dead', path.parent, current.describe(), age, self.stale_after_s)

  def _renew_loop(self) -> None:
    while not self._stop.wait(self.renew_every_s):
      for path in list(self._held):
        if not self._renew(path):
          return

  def _renew(self, path: epath.Path) -> bool:
    """Writes a newer renewal time; False (after on_lost) when the lease is
    no longer this job's. In a bucket the write is conditional on the
    generation this job wrote last, so it never overwrites a taker."""
    renewed = dataclasses.replace(self.holder, renewed=self._clock())
    url = str(path)
    if _in_bucket(path):
      try:
        self._generations[url] = lease_object.replace(url, _encoded(renewed),
                                                      self._generations[url])
        self.holder = renewed
        return True
      except lease_object.Changed:
        current = _read(path)
      except Exception as e:  # pylint: disable=broad-except
        logging.warning(
            'cannot renew the lease %s now (%s); trying again '
            'in %g s', path, e, self.renew_every_s)
        return True
    else:
      current = _read(path)
      if current is not None and current.token == self.holder.token:
        self.holder = renewed
        _write(path, self.holder)
        return True
    taker = current.describe() if current else 'someone (it is gone)'
    message = (f'lost the lease on {path.parent} to {taker}; this job '
               'stops so that the two jobs do not both write there')
    logging.error('%s', message)
    self._held.remove(path)
    if self._on_lost is not None:
      self._on_lost(message)
    return False

  def release(self) -> None:
    """Stops renewing and removes the leases this job still holds."""
    self._stop.set()
    if self._thread not in (None, threading.current_thread()):
      self._thread.join(timeout=5)
    for path in self._held:
      if _in_bucket(path):  # Only the generation this job wrote.
        try:
          lease_object.delete(str(path), self._generations[str(path)])
        except Exception:  # pylint: disable=broad-except
          pass  # It goes stale and is taken over.
        continue
      current = _read(path)
      if current is not None and current.token == self.holder.token:
        try:
          path.unlink()
        except (FileNotFoundError, OSError):
          pass
    self._held = []


def job_id() -> str:
  """This job's identity for its lease; restarts of one job share it."""
  return cluster.job_id() or uuid.uuid4().hex


def take(directories: list[str], client: Optional[coordination.Client],
         stale_after_s: float, on_lost: Callable[[str], None],
         timeout_s: float) -> Optional[Lease]:
  """Process 0 leases `directories` for the job; every process learns how
  that went.

  Args:
    directories: the workdir and the checkpoint directory.
    client: the coordination service, None for a single process.
    stale_after_s: --lease_timeout.
    on_lost: called with a message when the lease is taken from this job.
    timeout_s: how long the others wait for process 0's answer.

  Returns:
    The lease on process 0 (None on the others).

  Raises:
    WorkdirBusyError: on every process, when another job holds a lease.
  """
  taken = []

  def acquire() -> str:
    """Process 0: 'ok', or why the lease was refused."""
    lease = Lease(directories,
                  job_id(),
                  stale_after_s=stale_after_s,
                  on_lost=on_lost)
    try:
      lease.acquire()
    except WorkdirBusyError as e:
      return str(e)
    taken.append(lease)
    return 'ok'

  answer = acquire() if client is None else client.from_0(
      'podrun/lease', acquire, timeout_s)
  if answer != 'ok':
    raise WorkdirBusyError(answer)
  return taken[0] if taken else None
