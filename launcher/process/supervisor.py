"""Supervision inside every process of a job, whoever started it.

A cluster (a TPU pod, SLURM, Kubernetes, hosts started by hand) runs one
`python -m launcher` per host with nobody watching them as a whole. Each
process therefore watches the job itself, through JAX's own coordination
service (runtime/coordination.py), with a thread beside the training loop:

- failure broadcast: a process that fails publishes its cause once, first
  writer wins, under `podrun/end`; every other process sees it within a
  fraction of a second, logs one line naming the root cause and exits with
  exit_codes.PEER_FAILED. The failing process keeps its own code;
- lost processes: every process publishes a heartbeat each second; process 0
  declares one lost after --heartbeat_timeout seconds of silence and
  publishes that as the cause. A process that cannot reach the coordinator
  (process 0) for as long does the same for process 0. A process whose host
  the launcher saw go (peers.Gone) is lost after a few seconds' silence;
- the hang watchdog: no step completed for --stall_timeout seconds (or no
  first step within --first_step_timeout) makes this process publish a
  stall; every process then dumps all its threads' stacks into its log,
  names the laggards and exits exit_codes.STALLED;
- stragglers: process 0 warns when a process spends over 1.5x the median
  time of its own per step (its input, its dispatch), which every step of
  the job then waits for.

Process 0 hosts the coordination service, so when it publishes an end it
waits (briefly) until the others have read it before it exits.
"""

import dataclasses
import faulthandler
import os
import socket
import sys
import threading
import time
from typing import Callable, NoReturn, Optional

from absl import logging

from launcher.process import contact as contact_lib
from launcher.process import end_of_job
from launcher.process import peers as peers_lib
from launcher.process import stall
from runtime.common import exit_codes
from runtime.common import goodput
from runtime.common import layout
from runtime.common import progress
from launcher.common import process_flags
from launcher.common import record_mirror
from runtime.common import records
from runtime import coordination

# The supervision flags, declared with the flags they are.
WatchFlags = process_flags.WatchFlags


def _flush(code: int) -> None:
  """Writes out what this process has to say before it exits with `code`."""
  goodput.current().note(exit_code=code)
  goodput.current().flush(final=True)
  record_mirror.finish_current()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass


def _note_fault(cause: records.Fault) -> None:
  """Tells the goodput ledger when the fault that ends this process began
  and when this process learned of it (the time to recover's first two
  phases)."""
  now = time.time()
  goodput.current().note(
      fault=dataclasses.replace(cause, at=min(cause.at, now), detected=now))


def flush_and_exit(code: int) -> NoReturn:
  """Writes out what this process has to say and exits with `code` at once,
  from any thread, without JAX's shutdown barrier."""
  _flush(code)
  os._exit(code)  # pylint: disable=protected-access


class Supervisor:
  """The watcher of one process; see the module docstring.

  Its parts: the heartbeats and the coordinator's silence
  (`contact.Contact`, over `peers.Peers`), the hang watchdog
  (`stall.StallWatch`) and the end-of-job handshake
  (`end_of_job.EndOfJob`); this class runs them from one thread and ends
  the process.

  Example:
    >>> supervisor = Supervisor(coordination.current(), WatchFlags())
    >>> supervisor.start()
    >>> ...                                  # the workload
    >>> supervisor.finishing()               # no more steps to watch
    >>> supervisor.stop()
  """

  def __init__(self,
               client: Optional[coordination.Client],
               options: WatchFlags,
               host: Optional[str] = None,
               exit_process: Callable[[int], None] = flush_and_exit,
               dump_stacks: Optional[Callable[[], None]] = None):
    self.client = client
    self.options = options
    self.host = host or socket.gethostname()
    self.process_index = client.process_index if client else 0
    self._exit_process = exit_process
    self._dump_stacks = dump_stacks or (
        lambda: faulthandler.dump_traceback(sys.stderr, all_threads=True))
    self._ending = threading.Lock()  # Held by whoever ends this process.
    self._in_handshake = False  # `fail` took part in the end of the job.
    self._stop = threading.Event()
    self._watching_steps = True
    self._thread: Optional[threading.Thread] = None
    self.cpu_s = 0.0  # What watching has cost this process.
    # Without a coordination service there are no peers to hear from.
    self._peers = (None if client is None else peers_lib.Peers(
        client, self.host, options.heartbeat_timeout))
    self._contact = (None if self._peers is None else contact_lib.Contact(
        self._peers, options.heartbeat_timeout))
    self._end = end_of_job.EndOfJob(client)
    self._stall = stall.StallWatch(self.process_index, self.host,
                                   options.stall_timeout,
                                   options.first_step_timeout,
                                   _stall_floor(client, options),
                                   options.learned_stall_deadline)

  def start(self) -> None:
    if not self.options.enabled:
      return
    self._stall.started_at = time.monotonic()
    if self._contact is not None:
      self._contact.last = self._stall.started_at
    self._thread = threading.Thread(target=self._watch,
                                    daemon=True,
                                    name='podrun-supervisor')
    self._thread.start()

  def learn_in(self, record: layout.Record) -> None:
    """The watchdog starts from, and keeps, the pace learned in the record."""
    self._stall.learn_in(record)

  def finishing(self) -> None:
    """The workload returned: stop the watchdog and the loss check."""
    self._watching_steps = False
    self._stall.keep(progress.snapshot(), time.monotonic(), force=True)

  def abort(self, code: int, summary: str) -> None:
    """Ends this process from any thread with `code`, telling the others."""
    if not self._ending.acquire(blocking=False):
      return
    logging.error('stopping with exit code %d: %s', code, summary)
    self._exit_after_acks(
        code,
        self._end.publish(
            records.Fault('failed', self.process_index, self.host, code,
                          summary)))

  def publish_final(self) -> None:
    """Publishes this process's last step times, for summary.json."""
    if self._contact is not None and self.options.enabled:
      self._contact.beat(progress.snapshot(), self.cpu_s)

  def stop(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)

  # The watcher thread.

  def _watch(self) -> None:
    next_beat = 0.0
    while not self._stop.is_set():
      cause = self._poll_end()
      if cause is not None:
        self._end_for(cause)
        return
      now = time.monotonic()
      if now >= next_beat:
        next_beat = now + peers_lib.BEAT_EVERY_S
        found = self._check(now)
        if found is not None:
          won = self._end.publish(found)
          if self.client is None:  # Nobody to tell: end here.
            self._end_for(won)
            return

  def _poll_end(self) -> Optional[records.Fault]:
    """The job's end if published; a 'lost' cause for a silent coordinator."""
    if self._contact is None:
      self._stop.wait(contact_lib.TICK_S)
      return None
    return self._contact.end_or_loss(self._end, self._stop)

  def _check(self, now: float) -> Optional[records.Fault]:
    """The once-a-second duties; returns a cause to publish, if any."""
    snapshot = progress.snapshot()
    self.cpu_s = time.thread_time()
    if self._contact is not None:
      self._contact.beat_in_background(snapshot, self.cpu_s)
    if not self._watching_steps:
      return None
    if self.process_index == 0 and self._peers is not None:
      lost = self._peers.find_lost(now, peers_lib.gone())
      if lost is not None:
        return lost
      self._peers.warn_stragglers(now)
    return self._stall.check(snapshot, now)

  # Ending the process.

  def fail(self, code: int, summary: str, may_be_consequence: bool) -> int:
    """The failure path of this process's main thread; returns its exit code.

    Args:
      code: the code this process would exit with.
      summary: one line on why.
      may_be_consequence: the failure could come from another process's
        (an error inside a collective, an uncaught exception): wait a moment
        for that process's cause before claiming to be the root.

    Returns:
      `code`, or exit_codes.PEER_FAILED when another process failed first.
      The caller writes its records, calls `leave`, and exits.
    """
    if self.client is None or not self.options.enabled:
      return code
    self._ending.acquire()  # The watcher no longer ends this process.
    self._in_handshake = True
    if may_be_consequence:
      earlier = self._end.wait(_consequence_wait_s(summary, self.options))
      if earlier is not None and earlier.process_index != self.process_index:
        return self._follow(earlier)
    won = self._end.publish(
        records.Fault('failed', self.process_index, self.host, code, summary))
    if won.process_index != self.process_index and may_be_consequence:
      return self._follow(won)
    self._end.wait_for_acks(won)
    return code

  def _follow(self, cause: records.Fault) -> int:
    """This process's failure came from `cause`: say so; PEER_FAILED."""
    _note_fault(cause)
    logging.error('%s; this process stops too (exit %d).', cause.describe(),
                  exit_codes.PEER_FAILED)
    self._end.wait_for_acks(cause)
    return exit_codes.PEER_FAILED

  def leave(self) -> None:
    """The last act of a process that a failure or a preemption ends, once
    it has written its records: acknowledges the end, so that process 0 may
    exit. After a preemption, which publishes no end, process 0 waits here
    for the others' acknowledgements."""
    if self.client is None or not self.options.enabled:
      return
    self._end.ack()
    if not self._in_handshake:
      self._end.wait_for_acks()

  def _end_for(self, cause: records.Fault) -> None:
    """The watcher saw `cause`: end this process accordingly."""
    if cause.process_index == self.process_index and cause.kind == 'failed':
      return  # Our own failure: the main thread is on its way out.
    if cause.kind == 'failed' and cause.exit_code in exit_codes.SAME_EVERYWHERE:
      # Every process probably finds the same fault itself: let it say so.
      time.sleep(1.0)
    if not self._ending.acquire(blocking=False):
      return
    code = _say_why(cause, self._peers, self._dump_stacks)
    _note_fault(cause)
    # What this attempt learned of its pace is for the next one.
    self._stall.keep(progress.snapshot(), time.monotonic(), force=True)
    self._exit_after_acks(code, cause)

  def _exit_after_acks(self, code: int, cause: records.Fault) -> None:
    # Everything written first: once process 0 has every ack it exits, and
    # its coordination service with it, which JAX makes fatal to the others.
    _flush(code)
    if not (cause.kind == 'lost' and cause.process_index == 0):
      self._end.ack()
      self._end.wait_for_acks(cause)
    # Else the lost one is process 0, and its service with it: nobody takes
    # an ack, and a call to a service that is stopped never returns.
    self._exit_process(code)


def _say_why(cause: records.Fault, peers: Optional[peers_lib.Peers],
             dump_stacks: Callable[[], None]) -> int:
  """Logs why another's cause ends this process (a stall with every
  thread's stack); returns the code this process exits with."""
  if cause.kind == 'stalled':
    dump_stacks()
    _log_stall(cause, peers)
    return exit_codes.STALLED
  logging.error('%s; this process stops too (exit %d).', cause.describe(),
                exit_codes.PEER_FAILED)
  return exit_codes.PEER_FAILED


def _log_stall(cause: records.Fault, peers: Optional[peers_lib.Peers]) -> None:
  """Says that the job stalled, and which processes lag (given `peers`)."""
  laggards = 'A single process'
  if peers is not None:
    # Let every process publish its state first.
    time.sleep(peers_lib.BEAT_EVERY_S * 1.5)
    laggards = peers.describe_laggards()
  logging.error(
      'the job stalled: %s. %s. Every process dumps its stacks '
      'into its log and exits %d.', cause.describe(), laggards,
      exit_codes.STALLED)


def _stall_floor(client: Optional[coordination.Client],
                 options: WatchFlags) -> float:
  """--stall_floor, and with peers never below --heartbeat_timeout + 2
  beats: a process that died is then named lost, with the ack wait that
  skips it, before its peers' steps are taken for stalled."""
  if client is None or client.process_count == 1:
    return options.stall_floor
  return max(options.stall_floor,
             options.heartbeat_timeout + 2 * peers_lib.BEAT_EVERY_S)


def _consequence_wait_s(summary: str, options: WatchFlags) -> float:
  """How long a failing process waits for another's cause before its own.

  A collective whose peer died fails with a transport error (CPU: gloo's
  "Connection reset by peer"); the peer's cause, or its loss, comes within
  the heartbeat timeout. Other failures wait only a moment.
  """
  transport = ('Gloo', 'Connection reset', 'Connection closed', 'UNAVAILABLE',
               'Socket closed', 'Broken pipe')
  if any(word in summary for word in transport):
    return options.heartbeat_timeout + 2 * peers_lib.BEAT_EVERY_S
  return 0.3
