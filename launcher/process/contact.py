"""This process's contact with the coordinator (process 0): its heartbeats,
and how long the service has not answered.

Process 0 hosts JAX's coordination service. A process that hears nothing
from it for longer than the heartbeat allows (less once the launcher saw
process 0's host go, peers.Gone) takes process 0 for lost. Only a
heartbeat the service took counts as an answer: a stopped (not gone)
coordinator takes calls and never answers them, so the heartbeat runs in a
thread of its own and its silence is what is judged.

Example:
  >>> contact = Contact(peers, heartbeat_timeout=10)
  >>> contact.beat_in_background(progress.snapshot(), cpu_s)
  >>> contact.end_or_loss(end, stop)     # the job's end, a loss, or None
"""

import threading
import time
from typing import Optional

from launcher.process import end_of_job
from launcher.process import peers as peers_lib
from runtime import coordination
from runtime.common import progress
from runtime.common import records

# How long one look for the job's end waits.
TICK_S = 0.5


class Contact:
  """The heartbeats of one process and the coordinator's silence.

  Args:
    peers: publishes this process's heartbeat (peers.Peers).
    heartbeat_timeout: --heartbeat_timeout, the silence allowed.
  """

  def __init__(self, peers: peers_lib.Peers, heartbeat_timeout: float):
    self._peers = peers
    self._heartbeat_timeout = heartbeat_timeout
    self._beats = 0
    self._sender: Optional[threading.Thread] = None
    self.last = time.monotonic()  # The service's last answer.

  def beat(self, snapshot: progress.Snapshot, cpu_s: float) -> None:
    """Publishes one heartbeat, and waits for it."""
    self._beats += 1
    if self._peers.publish_own(snapshot, self._beats, cpu_s):
      self.last = time.monotonic()

  def beat_in_background(self, snapshot: progress.Snapshot,
                         cpu_s: float) -> None:
    """`beat` in a thread of its own, unless the last one has not
    returned: then its silence is what counts."""
    if self._sender is not None and self._sender.is_alive():
      return
    self._sender = threading.Thread(target=self.beat,
                                    args=(snapshot, cpu_s),
                                    daemon=True,
                                    name='podrun-heartbeat')
    self._sender.start()

  def end_or_loss(self, end: end_of_job.EndOfJob,
                  stop: threading.Event) -> Optional[records.Fault]:
    """The job's end if published (waiting up to TICK_S); a 'lost' cause
    for a coordinator silent too long; else None."""
    try:
      cause = end.poll(TICK_S)
    except Exception as e:  # pylint: disable=broad-except
      lost = self._lost(e)
      if lost is None:
        stop.wait(TICK_S)
      return lost
    if cause is not None:
      self.last = time.monotonic()
      return cause
    # No end yet, or a coordinator that takes the call and never answers
    # (stopped, not gone): the poll's deadline reads the same, so only a
    # heartbeat the service took counts as contact (`beat`).
    return self._lost(TimeoutError('no answer to the heartbeats'))

  def _lost(self, error: Exception) -> Optional[records.Fault]:
    """Process 0's loss, when it has not answered for longer than
    allowed."""
    silent_s = time.monotonic() - self.last
    gone = peers_lib.gone()
    if silent_s <= gone.silence_allowed(0, self._heartbeat_timeout):
      return None
    return records.Fault(
        'lost',
        0,
        _coordinator_host(),
        summary=(
            f'the coordinator (process 0) did not answer for {silent_s:.0f} s '
            f'(--heartbeat_timeout={self._heartbeat_timeout:g}){gone.reason(0)};'
            f' last error: {peers_lib.first_line(error)}'),
        at=time.time() - silent_s)


def _coordinator_host() -> str:
  return coordination.coordinator_address().rpartition(':')[0] or '?'
