"""The local checkpoint tier: each process's own copy of the state, often.

The persistent tier (runtime/checkpoints/checkpoint.py) goes to storage every
process shares, often a bucket, and is written rarely. This tier is written
often (runtime/checkpoints/local_cadence.py) by every process, into a
directory on its own host, so that a hard failure (SIGKILL, the OOM killer, a
lost host) costs a few steps instead of everything since the last persistent
save. The copy leaves the devices while the next steps run, where a device
has the memory for one more state (`loop.Run.local_state_later`). The state is replicated, so any one process's copy restores
all of them (runtime/checkpoints/recovery.py).

Layout: LOCAL_DIR/JOB/rank_<i>/step_<s>/{state.npz, meta.json}, where
LOCAL_DIR is config.local_checkpoint_dir (default:
$PODRUN_LOCAL_CHECKPOINT_DIR, else a directory in /dev/shm, else the
system's temporary directory) and JOB an id that lives beside the
persistent checkpoints, so that a workdir started afresh never picks up an
older job's copies. state.npz holds one array per leaf of the TrainState,
named by its tree path, with the leaf's own shape and dtype (no device
axis). A copy is written into `.tmp_step_<s>` and renamed when
complete: a SIGKILL during a save leaves the previous copy, and the torn one
is removed at the next start. Copies other jobs left behind are removed at
start when no run can use them (runtime/checkpoints/local_leftovers.py).

A process writes under its current index, but restores from any copy of
the job on its own disk, whatever index wrote it: an elastic job renumbers
its processes when it shrinks or grows (a survivor of slice 1 may be
process 0 next), and its disk still holds what it wrote before. Each
directory names the attempt that last wrote into it (`.attempt`), so that
at a successful end a process removes, besides its own, the directories an
earlier attempt's numbering left on its disk.

Why not orbax here: its numpy handler writes arrays on process 0 only, so a
per-process CheckpointManager (active_processes={i}) of host arrays leaves
every other process's copy without its arrays (measured with orbax 0.12.8).

Example:
  >>> local = LocalCheckpoints('/dev/shm/podrun-0/3f2a/rank_1', every=25)
  >>> local.save(450, numpy_state, meta)   # returns at once
  >>> local.steps()
  [425, 450]
  >>> state, meta = local.load(450, like=numpy_state), local.meta(450)
"""

from concurrent import futures
import io
import json
import math
import mmap
import os
import shutil
import struct
import tempfile
import threading
import uuid
import zipfile
import zlib
from typing import Any, Callable, Optional

from absl import logging
from etils import epath
import jax
import numpy as np

from runtime.common import handoff
from runtime import coordination
from runtime.checkpoints import local_cadence
from runtime.checkpoints import options as checkpoint_options
from runtime.checkpoints import local_leftovers

JOB_ID_FILE = '.podrun_local_tier_id'
RANK_PREFIX = 'rank_'
_ATTEMPT_FILE = '.attempt'
_STEP_PREFIX = 'step_'
_TMP_PREFIX = '.tmp_step_'
_JOB_ID_KEY = 'podrun/local_tier_id'
# What reading a damaged copy raises: a truncated or garbled zip, a file
# gone, an array missing, a checksum that does not match.
UNREADABLE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)
# A zip member's local header before its name, and room for an .npy header.
_ZIP_LOCAL_HEADER = 30
_NPY_HEADER_MAX = 4096

SHM = '/dev/shm'


def default_root(needed_bytes: int = 0, shm: str = SHM) -> str:
  """Where local copies go by default: $PODRUN_LOCAL_CHECKPOINT_DIR when set,
  else shared memory when the host has it and it has room for
  `needed_bytes` (the copies this process will keep, and the one being
  written).

  /dev/shm is RAM: a save costs a memory copy, and it survives the process
  (not the host). Without it, or where it is too small (Docker and
  Kubernetes give a container 64 MB), the system's temporary directory,
  said once with how to give the container more.
  """
  configured = handoff.Settings.read().local_checkpoint_dir
  if configured:
    return configured
  temporary = os.path.join(tempfile.gettempdir(), f'podrun-local-{os.getuid()}')
  if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
    return temporary
  free = _free_bytes(shm)
  if needed_bytes and free is not None and free < needed_bytes:
    logging.warning(
        '%s has %.1f MB free, but the local tier keeps copies of %.1f MB '
        '(config.keep_local_checkpoints and the one being written): they go '
        'to %s instead, on disk. Give the container more shared memory: '
        'docker run --shm-size=%dg, or in Kubernetes an emptyDir volume with '
        'medium: Memory mounted at /dev/shm (docs/deployments/kubernetes.md)',
        shm, free / 1e6, needed_bytes / 1e6, temporary,
        max(1, -(-needed_bytes * 2 // 2**30)))
    return temporary
  return os.path.join(shm, f'podrun-{os.getuid()}')


def _free_bytes(path: str) -> Optional[int]:
  try:
    stats = os.statvfs(path)
  except OSError:
    return None
  return stats.f_bavail * stats.f_frsize


def job_id(persistent_dir: str) -> str:
  """The id of the job whose persistent checkpoints live in `persistent_dir`.

  Created on first use; a directory removed and started afresh gets a new
  one, which orphans the old job's local copies instead of resuming them.
  Called by process 0 only: others get the id through the coordination
  service.
  """
  path = epath.Path(persistent_dir) / JOB_ID_FILE  # gs:// too, as orbax.
  if path.exists():
    return path.read_text().strip()
  path.parent.mkdir(parents=True, exist_ok=True)
  new = uuid.uuid4().hex[:16]
  path.write_text(new + '\n')
  return new


def open_for(tier: checkpoint_options.LocalTier,
             persistent_dir: str,
             attempt: str = '',
             state_bytes: int = 0) -> Optional['LocalCheckpoints']:
  """This process's local tier, or None when it is off (`tier.enabled`).

  Args:
    tier: its cadence, how many copies it keeps, and where.
    persistent_dir: the persistent tier's directory, where the job's id
      lives.
    attempt: the attempt's name, which its copies record ('' for none).
    state_bytes: one copy's bytes, at most: the default root is checked for
      room for the copies kept and the one being written.
  """
  if not tier.enabled:
    return None
  client = coordination.current()
  cadence = local_cadence.Cadence(tier.every_steps,
                                  tier.every_s,
                                  client,
                                  budgeted=tier.budgeted)
  jid = (job_id(persistent_dir) if client is None else client.from_0(
      _JOB_ID_KEY, lambda: job_id(persistent_dir)))
  root = tier.root or default_root(state_bytes * (tier.keep + 1))
  index = client.process_index if client is not None else 0
  _sweep_leftovers(tier.leftover_hours, root, jid, index)
  return LocalCheckpoints(os.path.join(root, jid, f'{RANK_PREFIX}{index}'),
                          every=tier.every_steps,
                          keep=tier.keep,
                          cadence=cadence,
                          attempt=attempt,
                          owner=persistent_dir)


def _sweep_leftovers(hours: float, root: str, jid: str,
                     process_index: int) -> None:
  """Removes or names the copies other jobs left on this host, those over
  `hours` old."""
  for line in local_leftovers.sweep(root, jid, hours * 3600):
    # Every host sweeps its own; the first process says what it found.
    (logging.warning if process_index == 0 else logging.info)('%s', line)


def _array_in(buffer: memoryview, name: str) -> np.ndarray:
  """The .npy file held in `buffer` as a read-only view of it."""
  header = io.BytesIO(bytes(buffer[:_NPY_HEADER_MAX]))
  version = np.lib.format.read_magic(header)
  read_header = (np.lib.format.read_array_header_1_0
                 if version == (1, 0) else np.lib.format.read_array_header_2_0)
  shape, fortran, dtype = read_header(header)
  if dtype.hasobject:
    raise ValueError(f'{name}: an array of Python objects')
  count = math.prod(shape)
  return np.frombuffer(buffer, dtype, count,
                       header.tell()).reshape(shape,
                                              order='F' if fortran else 'C')


def read_npz(path: str) -> dict[str, np.ndarray]:
  """The arrays of an uncompressed .npz (np.savez's) as read-only views of
  the file mapped into memory, each member's CRC checked (on threads: the
  check releases the GIL): no copy, where np.load copies each array twice
  through the zip reader (0.83 s against 0.08 s for 400 MB in /dev/shm on
  2 cores). The map lives as long as any array does.

  Raises:
    one of UNREADABLE: a file that is no zip, is cut short, compresses a
      member, or whose member fails its CRC.
  """
  with open(path, 'rb') as f:
    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
  whole = memoryview(mapped)
  with zipfile.ZipFile(path) as saved:
    members = saved.infolist()

  def one(info: zipfile.ZipInfo) -> tuple[str, np.ndarray]:
    if info.compress_type != zipfile.ZIP_STORED:
      raise zipfile.BadZipFile(f'{info.filename} is compressed')
    start = info.header_offset
    local = whole[start:start + _ZIP_LOCAL_HEADER]
    if bytes(local[:4]) != b'PK\x03\x04':
      raise zipfile.BadZipFile(f'{info.filename}: no local header')
    names, extra = struct.unpack('<HH', local[26:30])
    begin = start + _ZIP_LOCAL_HEADER + names + extra
    data = whole[begin:begin + info.file_size]
    if len(data) != info.file_size or zlib.crc32(data) != info.CRC:
      raise zipfile.BadZipFile(f'{info.filename}: bad CRC or cut short')
    return info.filename.removesuffix('.npy'), _array_in(data, info.filename)

  with futures.ThreadPoolExecutor(min(8, len(members) or 1)) as pool:
    return dict(pool.map(one, members))


def _flat(state: Any) -> dict[str, np.ndarray]:
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


class LocalCheckpoints:
  """One process's local copies: save every `every` steps, keep `keep`.

  Saves run on a thread of their own; the caller hands over host arrays it
  will not change (the step writes new buffers).
  """

  def __init__(self,
               path: str,
               every: int,
               keep: int = 2,
               cadence: Optional[local_cadence.Cadence] = None,
               attempt: str = '',
               owner: str = ''):
    if keep < 1:
      raise ValueError(f'config.keep_local_checkpoints={keep}; keep at '
                       'least 1')
    self.path, self.every, self.keep = path, every, keep
    self.attempt = attempt
    self.cadence = cadence or local_cadence.Cadence(every_steps=every)
    self._thread: Optional[threading.Thread] = None
    self._owner = owner
    self._made = False
    if os.path.isdir(path):
      for name in os.listdir(path):
        if name.startswith(_TMP_PREFIX):  # A save cut short.
          shutil.rmtree(os.path.join(path, name), ignore_errors=True)

  def _make(self) -> None:
    """Makes the directories at the first save, so that a run refused
    before it (or one that never saves) leaves nothing in /dev/shm."""
    if self._made:
      return
    os.makedirs(self.path, exist_ok=True)
    if self._owner:
      local_leftovers.write_owner(os.path.dirname(self.path), self._owner)
    with open(os.path.join(self.path, _ATTEMPT_FILE), 'w') as f:
      f.write(self.attempt)
    self._made = True

  def due(self, step: int) -> bool:
    """Whether a cadence in steps copies `step` (see `cadence`)."""
    return self.every > 0 and step % self.every == 0

  def steps(self) -> list[int]:
    """The complete copies' steps in this process's directory, oldest
    first."""
    return _steps_in(self.path)

  def _siblings(self) -> list[str]:
    """The job's other directories on this disk (other indices)."""
    parent = os.path.dirname(self.path)
    try:
      names = os.listdir(parent)
    except OSError:
      return []
    return [
        os.path.join(parent, n)
        for n in sorted(names)
        if n.startswith(RANK_PREFIX) and os.path.join(parent, n) != self.path
    ]

  def held(self) -> dict[int, str]:
    """{step: directory} of every complete copy of the job on this disk,
    this process's own first, then any other index's."""
    found: dict[int, str] = {}
    for directory in [self.path] + self._siblings():
      for step in _steps_in(directory):
        found.setdefault(step, directory)
    return dict(sorted(found.items()))

  def _dir(self, step: int) -> str:
    return os.path.join(self.path, f'{_STEP_PREFIX}{step}')

  def _held_dir(self, step: int) -> str:
    """The copy of `step` on this disk: this process's, else another's."""
    return os.path.join(self.held().get(step, self.path),
                        f'{_STEP_PREFIX}{step}')

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Starts writing `state` as step `step`; returns at once.

    `state` is host arrays, or `() -> host arrays`, which the writing thread
    calls (a copy still on its way from the devices: `Run.local_state_later`).
    Waits for the previous save first, so at most one is being written.
    """
    self.wait()
    if callable(state):
      read = lambda: _flat(state())
    else:
      arrays = _flat(state)
      read = lambda: arrays
    self._thread = threading.Thread(target=self._write,
                                    args=(step, read, meta),
                                    name=f'local-checkpoint-{step}',
                                    daemon=True)
    self._thread.start()

  def _write(self, step: int, read: Callable[[], dict[str, np.ndarray]],
             meta: dict[str, Any]) -> None:
    tmp = os.path.join(self.path, f'{_TMP_PREFIX}{step}')
    try:
      arrays = read()
      self._make()
      shutil.rmtree(tmp, ignore_errors=True)
      os.makedirs(tmp)
      np.savez(os.path.join(tmp, 'state.npz'),
               **arrays)  # type: ignore[arg-type]
      with open(os.path.join(tmp, 'meta.json'), 'w') as f:
        json.dump(meta, f)
      shutil.rmtree(self._dir(step), ignore_errors=True)
      os.rename(tmp, self._dir(step))
      for old in self.steps()[:-self.keep]:
        shutil.rmtree(self._dir(old), ignore_errors=True)
    except OSError as e:
      # The local tier only saves time; a full disk must not stop training.
      logging.warning('local checkpoint of step %d in %s failed: %s', step,
                      self.path, e)
      shutil.rmtree(tmp, ignore_errors=True)

  def meta(self, step: int) -> dict[str, Any]:
    with open(os.path.join(self._held_dir(step), 'meta.json')) as f:
      return json.load(f)

  def unreadable(self, step: int, like: Any) -> Optional[str]:
    """Why the copy of `step` cannot be restored (its meta.json does not
    parse, its state.npz is gone, is no zip or lacks an array of `like`),
    or None. Reads the zip's directory, not the arrays: a truncated or
    removed file is caught here; a garbled array only by `load`."""
    directory = self._held_dir(step)
    try:
      self.meta(step)
      with zipfile.ZipFile(os.path.join(directory, 'state.npz')) as saved:
        names = {n.removesuffix('.npy') for n in saved.namelist()}
    except UNREADABLE as e:
      return f'{type(e).__name__}: {e}'
    paths, _ = jax.tree_util.tree_flatten_with_path(like)
    missing = [
        jax.tree_util.keystr(p)
        for p, _ in paths
        if jax.tree_util.keystr(p) not in names
    ]
    return f'no array {missing[0]} (and {len(missing) - 1} more)' if (
        missing) else None

  def set_aside(self, step: int, why: str) -> None:
    """Removes a copy of `step` that cannot be read, saying so."""
    directory = self._held_dir(step)
    logging.warning(
        'the local copy %s cannot be read (%s): removed; the '
        'restore goes on from another copy', directory, why)
    shutil.rmtree(directory, ignore_errors=True)

  def load(self, step: int, like: Any) -> Any:
    """The copy of `step` as host arrays in the tree of `like`.

    Raises:
      one of UNREADABLE: when the copy is damaged or lacks an array of
        `like`.
    """
    arrays = read_npz(os.path.join(self._held_dir(step), 'state.npz'))
    paths, treedef = jax.tree_util.tree_flatten_with_path(like)
    return jax.tree_util.tree_unflatten(
        treedef, [arrays[jax.tree_util.keystr(p)] for p, _ in paths])

  def wait(self) -> None:
    """Blocks until the save being written, if any, is complete."""
    if self._thread is not None:
      self._thread.join()
      self._thread = None

  def clear(self) -> None:
    """Removes every copy, keeping the directory."""
    self.wait()
    for step in self.steps():
      shutil.rmtree(self._dir(step), ignore_errors=True)

  def remove(self) -> None:
    """Removes every copy (the job ended well: they are not needed): this
    process's, and those an earlier attempt's numbering left on this disk
    (another process of this attempt removes its own)."""
    self.wait()
    shutil.rmtree(self.path, ignore_errors=True)
    for sibling in self._siblings():
      if _attempt_of(sibling) != self.attempt:
        shutil.rmtree(sibling, ignore_errors=True)
    parent = os.path.dirname(self.path)
    try:
      if set(os.listdir(parent)) <= {local_leftovers.OWNER_FILE}:
        # The job's directory, once no process of this host uses it.
        shutil.rmtree(parent, ignore_errors=True)
    except OSError:
      pass


def _steps_in(directory: str) -> list[int]:
  """The complete copies' steps in one process's directory, oldest first."""
  try:
    names = os.listdir(directory)
  except OSError:
    return []
  return sorted(
      int(n[len(_STEP_PREFIX):])
      for n in names
      if n.startswith(_STEP_PREFIX) and n[len(_STEP_PREFIX):].isdigit())


def _attempt_of(directory: str) -> Optional[str]:
  try:
    with open(os.path.join(directory, _ATTEMPT_FILE)) as f:
      return f.read()
  except OSError:
    return None
