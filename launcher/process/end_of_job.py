"""How the processes of a job agree that it ends, and on why.

The first process to publish a cause under END_KEY wins; every other process
reads it back within a tick. Each process that ends for it, the one that
failed included, acknowledges under ACK_DIR as its last act before it exits,
and process 0, which hosts the coordination service, waits briefly for
those acknowledgements before it exits: once it is gone, JAX aborts every
other process at its next call or poll of the service.

Example:
  >>> end = EndOfJob(coordination.current())
  >>> won = end.publish(records.Fault('failed', 1, 'host-1', 7, 'ValueError'))
  >>> end.ack(); end.wait_for_acks(won)
"""

import json
import time
from typing import Optional

from absl import logging

from launcher.process import peers as peers_lib
from runtime import coordination
from runtime.common import records

END_KEY = 'podrun/end'
ACK_DIR = 'podrun/ack'
# Process 0 waits this long for the others' acknowledgements, then this
# long more, so that their own exits land first.
_ACK_WAIT_S = 3.0
_AFTER_ACKS_S = 0.2


def encode(cause: records.Fault) -> str:
  """`cause` as END_KEY's value."""
  return json.dumps(cause.to_json())


def decode(text: str) -> records.Fault:
  """END_KEY's value as the fault it publishes."""
  fault = records.Fault.from_json(json.loads(text))
  if fault is None:
    raise ValueError(f'{END_KEY} holds {text!r}, not a fault')
  return fault


class EndOfJob:
  """One process's side of the end-of-job handshake."""

  def __init__(self, client: Optional[coordination.Client]):
    self.client = client
    self.process_index = client.process_index if client else 0

  def publish(self, cause: records.Fault) -> records.Fault:
    """Publishes `cause` unless another is there; returns the one that won."""
    if self.client is None:
      return cause
    try:
      if self.client.set(END_KEY, encode(cause)):
        return cause
      won = self.client.get(END_KEY)
      return decode(won) if won else cause
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('could not publish the end of the job (%s): %s',
                      cause.describe(), peers_lib.first_line(e))
      return cause

  def poll(self, timeout_s: float) -> Optional[records.Fault]:
    """The published cause, waiting up to timeout_s; None if none yet.

    Raises:
      Exception: whatever the coordination service raised: process 0 may
        be gone, which the caller judges by how long it has been silent.
    """
    if self.client is None:
      return None
    text = self.client.wait(END_KEY, timeout_s)
    return decode(text) if text else None

  def wait(self, timeout_s: float) -> Optional[records.Fault]:
    """Like `poll`, but None also when the service does not answer."""
    try:
      return self.poll(timeout_s)
    except Exception:  # pylint: disable=broad-except
      return None

  def ack(self) -> None:
    """Says that this process has seen the end."""
    if self.client is None:
      return
    try:
      self.client.publish(ACK_DIR, '1')
    except Exception:  # pylint: disable=broad-except
      pass

  def wait_for_acks(self, cause: Optional[records.Fault] = None) -> None:
    """Process 0 keeps the service up until the others have seen the end.

    The process a loss names is not waited for: it is gone; nor are those
    whose hosts the launcher saw go (peers.Gone). The one a failure names
    is: until it has acknowledged, it may still be writing its records or
    waiting on its own publish, and JAX would abort it mid-way. (A stalled
    one ends like everyone else.)
    """
    if self.process_index != 0 or self.client is None:
      return
    expected = set(range(1, self.client.process_count))
    expected -= peers_lib.gone().processes
    if cause is not None and cause.kind == 'lost':
      expected.discard(cause.process_index)
    waited_for = bool(expected)
    deadline = time.monotonic() + _ACK_WAIT_S
    while expected and time.monotonic() < deadline:
      try:
        expected -= set(self.client.by_process(ACK_DIR))
      except Exception:  # pylint: disable=broad-except
        return
      time.sleep(0.02)
    if waited_for:
      time.sleep(_AFTER_ACKS_S)
