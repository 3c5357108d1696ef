"""Elastic slices: a multislice job that trains on the slices it has.

With --min_slices=K (and --create --num_slices=N, K < N) each slice is a
queued resource of its own, NAME-0 ... NAME-(N-1), with a node of the same
name, so that losing one never takes the others. When a slice is lost the
attempt ends as before (the preemption notice makes every process save the
step they agree on; without it they restore their local copies), and:

- at least K left: the job starts again at once on them, renumbered (the
  first of them holds process 0 and the MEGASCALE coordinator), while the
  lost slice is deleted, created again and set up in the background, each
  phase with its own timeout;
- once it is READY, HEALTHY and set up, the running attempt is stopped at
  a step boundary as a preemption stops it (SIGTERM: every process saves
  the agreed step) and the job starts again on every slice; the new
  slice's processes have empty disks and restore from the others;
- fewer than K left: the next attempt waits for enough to be back.

The one elastic policy (launcher/elastic.py) decides, as for a local pod
or a Ray job: shrinks, growths and waits use none of --max_restarts after
an attempt that trained a new step. `SliceGroup` is the policy's
Capacity, and stands where one queued.Fleet stands without --min_slices
(create, wait_up, lost, delete), so the rest of the driver does not tell
them apart.

Example:
  >>> group = SliceGroup(launch, request, timeouts, 10, 'gcloud.log', 1)
  >>> elastic.Policy(group, say=print).after(end)   # slice 1's processes
  slice(s) fleet-1 lost: starting again at once on fleet-0; fleet-1 ...
  Resize(kind=<Kind.SHRINK: 'shrink'>, wait_s=0.0)
"""

import dataclasses
import itertools
import json
import os
import re
import threading
import time
from typing import Callable, Optional

from launcher import attempts
from launcher import elastic as policy
from launcher.tpu import babysit
from launcher.tpu import queued
from runtime.common import exit_codes
from runtime.common import files
from runtime.common import records

# Where a running elastic driver says which slices come back (--status).
STATUS_FILE = 'slices.json'
# The longest wait between two tries to bring a lost slice back.
_MAX_BACKOFF_S = 600.0


def requests(base: queued.Request) -> list[queued.Request]:
  """One queued resource per slice: NAME-i, with its node named as a
  multislice queued resource names it."""
  return [
      dataclasses.replace(base, name=f'{base.name}-{i}', nodes=(node,))
      for i, node in enumerate(base.nodes)
  ]


class SliceGroup:
  """The slices of an elastic launch: which run the job, and the lost ones
  coming back (`Comebacks`).

  Attributes:
    active: indices of the slices the next (or running) attempt runs on.
  """

  def __init__(self, launch: babysit.Owner, base: queued.Request,
               timeouts: queued.Timeouts, poll_s: float, log_path: str,
               minimum: int):
    self.launch = launch
    self.fleets = [
        queued.Fleet(launch.gcloud, request, timeouts, poll_s, log_path,
                     launch.say, self.interrupted) for request in requests(base)
    ]
    self.minimum = minimum
    self.active = list(range(len(self.fleets)))
    self.request = base
    self._comebacks = Comebacks(launch, lambda i: self.fleets[i], base.nodes)

  # slices.Slices, as the driver and an attempt use them.
  watched = True

  @property
  def ours(self) -> bool:
    return any(f.ours for f in self.fleets)

  @property
  def up(self) -> bool:
    return any(f.up for f in self.fleets)

  def create(self) -> None:
    for fleet in self.fleets:
      fleet.create()

  def wait_up(self) -> None:
    for fleet in self.fleets:
      fleet.wait_up()

  def lost(self) -> Optional[queued.Observation]:
    """The first slice of the job seen lost, or None."""
    for i in list(self.active):
      seen = self.fleets[i].lost()
      if seen is not None:
        return seen
    return None

  def delete(self, why: str) -> None:
    """Stops bringing slices back, then deletes every one this launch made."""
    self._comebacks.stop()
    for fleet in self.fleets:
      fleet.delete(why)

  def interrupted(self) -> bool:
    return self._comebacks.stopped() or self.launch.interrupted()

  def nodes(self) -> tuple[str, ...]:
    return tuple(self.request.nodes[i] for i in self.active)

  def requests(self) -> list[queued.Request]:
    return [f.request for f in self.fleets]

  def created(self) -> list[str]:
    return [f.request.name for f in self.fleets if f.ours]

  # elastic.Capacity, as the one elastic policy reads the slices.
  flag = '--min_slices'

  def running(self) -> int:
    return len(self.active)

  def describe(self) -> str:
    """'fleet-0; fleet-1 coming back': the slices the next attempt runs
    on, then those not in the job yet."""
    names = self.request.nodes
    text = ', '.join(names[i] for i in self.active)
    coming, set_up = self._comebacks.pending()
    coming = sorted(set(coming) - set(self.active))
    if coming:
      text += '; ' + ', '.join(names[i] +
                               (' back, joining at the next step boundary'
                                if i in set_up else ' coming back')
                               for i in coming)
    return text

  def grow_due(self, now: float) -> bool:
    """Whether a slice is back and set up, so the running attempt should
    stop at a step boundary and the job grow."""
    del now
    return bool(self._comebacks.pending()[1])

  def lose(self, end: attempts.AttemptEnd) -> str:
    """The slices that hold a process of `end.lost` (numbered on the
    slices the attempt ran on, `workers` a slice), and any other slice of
    the job seen lost now, leave the job and are brought back in the
    background."""
    workers = self.launch.workers
    held = {
        self.active[p // workers]
        for p in end.lost
        if p // workers < len(self.active)
    }
    lost = [
        i for i in self.active if i in held or not self.fleets[i].up or
        self.fleets[i].lost() is not None
    ]
    self.active = [i for i in self.active if i not in lost]
    for i in lost:
      self._comebacks.start(i)
    return ('slice(s) ' + ', '.join(self.request.nodes[i] for i in lost) +
            ' lost')

  def waiting(self) -> tuple[float, str]:
    """The next attempt waits for them (`ready`)."""
    return 0.0, 'the next attempt waits for enough to be back'

  def take_back(self) -> str:
    back = self._take_set_up()
    return ('slice(s) ' + ', '.join(self.request.nodes[i] for i in back) +
            ' back')

  def ready(self, now: float) -> policy.Ready:
    """Before an attempt: takes in slices back; waits while fewer than
    --min_slices are (the wait, when over a second, is the Ready's
    `infrastructure`); not ready when none can come (their recreate
    failed)."""
    del now  # The wait is dated by the wall clock, as goodput's records are.
    began = time.time()
    while True:
      self._take_set_up()
      if len(self.active) >= self.minimum:
        break
      if not self._comebacks.trying() or self.interrupted():
        return policy.Ready(False)
      time.sleep(0.2)
    return policy.Ready(True,
                        _waited(began) if time.time() - began > 1 else None)

  def _take_set_up(self) -> list[int]:
    """Takes the slices back and set up into the job; returns them."""
    back = self._comebacks.take()
    self.active = sorted(set(self.active) | set(back))
    return back


class Comebacks:
  """The threads that bring an elastic launch's lost slices back: each
  deletes, creates, waits for and sets up one slice, trying again after a
  back-off; where each stands is in LOG_DIR/slices.json (`SliceStatus`).

  Args:
    launch: the launch (its gcloud, options, say and set-up).
    fleet: slice index -> its queued resource.
    nodes: the node of each slice, by index.
  """

  def __init__(self, launch: babysit.Owner,
               fleet: Callable[[int], queued.Fleet], nodes: tuple[str, ...]):
    self._launch, self._fleet, self._nodes = launch, fleet, nodes
    self._stopping = threading.Event()
    self._threads: dict[int, threading.Thread] = {}
    self._set_up: set[int] = set()
    self._status = SliceStatus(launch.path(STATUS_FILE), launch.options.tpu)
    self._lock = threading.Lock()

  def start(self, index: int) -> None:
    """Brings slice `index` back in a thread of its own."""
    thread = threading.Thread(target=self._recreate, args=(index,), daemon=True)
    with self._lock:
      self._threads[index] = thread
    thread.start()

  def pending(self) -> tuple[list[int], set[int]]:
    """(the slices coming back and not taken yet, those of them set up)."""
    with self._lock:
      return sorted(self._threads), set(self._set_up)

  def trying(self) -> bool:
    """Whether a slice is still being brought back."""
    with self._lock:
      return any(t.is_alive() for t in self._threads.values())

  def take(self) -> list[int]:
    """The slices back and set up, now in the job: no longer pending."""
    with self._lock:
      back, self._set_up = sorted(self._set_up), set()
      for i in back:
        self._threads.pop(i, None)
    for i in back:
      self._note(i, 'in the job')
    return back

  def stop(self) -> None:
    """Stops every try and waits for the threads to end."""
    self._stopping.set()
    for thread in list(self._threads.values()):
      thread.join()

  def stopped(self) -> bool:
    return self._stopping.is_set()

  def _recreate(self, index: int) -> None:
    """Brings slice `index` back; a failed try is tried again after a
    back-off (--slice_back_backoff, doubling up to _MAX_BACKOFF_S) for as
    long as the job runs, or until --slice_back_timeout has passed."""
    node, launch = self._nodes[index], self._launch
    options = launch.options
    began = time.time()
    backoff = options.slice_back_backoff
    for tries in itertools.count(1):
      self._note(index, f'coming back (try {tries})')
      error = _recreate_once(self._fleet(index), launch, node)
      if error is None:
        break
      if error == 'interrupted':
        return
      left = began + options.slice_back_timeout - time.time()
      if left <= backoff:
        with self._lock:
          self._threads.pop(index, None)
        self._note(
            index, f'not coming back: {tries} tries failed in '
            f'{time.time() - began:.0f} s (--slice_back_timeout); the '
            f'last: {error}')
        launch.say(f'slice {node} did not come back in {tries} tries '
                   f'(--slice_back_timeout={options.slice_back_timeout:g}'
                   f' s): {error}; the job goes on without it')
        return
      self._note(index, f'retrying in {backoff:g} s: try {tries} failed: '
                 f'{error}',
                 retry_at=time.time() + backoff)
      launch.say(f'slice {node} did not come back (try {tries}): '
                 f'{error}; trying again in {backoff:g} s')
      if self._stopping.wait(backoff) or launch.interrupted():
        return
      backoff = min(2 * backoff, _MAX_BACKOFF_S)
    # Said before it is ready: once ready, the job may take it in and say
    # so at once, and --status must not go back to this line then.
    self._note(index, 'back, joining at the next step boundary')
    with self._lock:
      self._set_up.add(index)
    launch.say(f'slice {node} is back after {time.time() - began:.1f} s '
               '(delete, create, set-up): the job grows at its next step '
               'boundary')

  def _note(self, index: int, text: str, retry_at: float = 0.0) -> None:
    self._status.note(self._nodes[index], text, retry_at)


def _recreate_once(fleet: queued.Fleet, launch: babysit.Owner,
                   node: str) -> Optional[str]:
  """One delete, create, wait and set-up of the slice `fleet` asks for:
  None when it is up and set up, 'interrupted', or why it failed."""
  try:
    fleet.delete('the slice is lost')
    fleet.create()
    fleet.wait_up()
    launch.prepare(nodes=(node,))
  except queued.Interrupted:
    return 'interrupted'
  except exit_codes.PodrunError as e:
    return str(e)
  return None


class SliceStatus:
  """Where each slice coming back stands, in LOG_DIR/slices.json for
  --status (`status_lines` reads it)."""

  def __init__(self, path: str, tpu: str):
    self._path, self._tpu = path, tpu
    self._states: dict[str, dict] = {}
    self._lock = threading.Lock()

  def note(self, node: str, text: str, retry_at: float = 0.0) -> None:
    """Records `text` for `node`; `retry_at`: when its next try starts."""
    with self._lock:  # The newest state is the one the file keeps.
      self._states[node] = {'state': text, 'retry_at': retry_at}
      try:
        files.write_json(
            self._path, {
                'tpu': self._tpu,
                'pid': os.getpid(),
                'updated': time.time(),
                'slices': dict(self._states)
            })
      except OSError:
        pass  # The state is for --status; it must never stop the job.


def status_lines(log_dirs: list[str], tpu: str) -> list[str]:
  """What a running elastic driver of TPU `tpu` says of the slices it is
  bringing back, from LOG_DIR/slices.json in each of `log_dirs`: one
  line a slice; nothing when no such driver runs.

  Example:
    >>> status_lines(['tpu_logs/podrun-20261202-1'], 'fleet')
    ['slice fleet-1 (driver pid 4242): retrying in 38 s: try 2 failed: ...']
  """
  lines = []
  for log_dir in log_dirs:
    try:
      with open(os.path.join(log_dir, STATUS_FILE)) as f:
        status = json.load(f)
      os.kill(int(status['pid']), 0)
    except (OSError, ValueError, KeyError, TypeError):
      continue  # None there, or its driver has ended.
    if status.get('tpu') != tpu:
      continue
    for node, slice_state in sorted(status.get('slices', {}).items()):
      text = slice_state.get('state', '')
      retry_at = slice_state.get('retry_at') or 0
      if retry_at:
        left = max(0.0, retry_at - time.time())
        text = re.sub(r'^retrying in [0-9.]+ s', f'retrying in {left:.0f} s',
                      text)
      lines.append(f'slice {node} (driver pid {status["pid"]}): {text}')
  return lines


def _waited(began: float) -> records.Recreate:
  """The wait for enough slices, as goodput's infrastructure recovery."""
  now = time.time()
  return records.Recreate(lost='fewer than --min_slices up',
                          began=began,
                          recreate_requested=began,
                          up=now,
                          ready=now,
                          seconds=now - began)
