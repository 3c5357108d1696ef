"""Preemption notices, and the step at which every process stops for them.

SIGTERM is a preemption notice, whichever process gets it. In a multi-process
job JAX turns it into a notice for every process (its preemption notifier and
the coordination service), and `reached_preemption_sync_point` makes all
processes agree on one step: the one after the furthest any of them had got.
In a single process without jax.distributed, a SIGTERM handler sets a flag
that the training loop reads at the next step.

The loop calls `Notice.reached` once per step it runs, counting from 1 in this
run rather than from the global step: a notice that arrives before the loop
starts (during a restore or compilation) agrees on counter 1, the first step
of every process, whatever step the run resumed at.
"""

import signal
import threading

import jax
from jax.experimental import multihost_utils

from runtime.common import exit_codes


class Preempted(exit_codes.PodrunError):
  """The job saved a checkpoint at `step` and stops for a preemption."""
  exit_code = exit_codes.PREEMPTED

  def __init__(self, step: int):
    super().__init__(f'preempted: saved the checkpoint of step {step} and '
                     'stopped; run the same command again to resume')
    self.step = step


def _jax_sync_available() -> bool:
  if not jax.distributed.is_initialized():
    return False  # Without jax.distributed, no sync point: SIGTERM is ours.
  try:
    multihost_utils.reached_preemption_sync_point(0)
  except RuntimeError:  # jax_enable_preemption_service is off.
    return False
  return True


class Notice:
  """Tells the training loop when to stop for a preemption.

  Use as a context manager around the loop; in a single process it installs
  a SIGTERM handler there and restores the previous one on leaving.

  Example:
    >>> with Notice() as notice:
    ...   for count, step in enumerate(range(start, steps), 1):
    ...     state = train_step(state)
    ...     if notice.reached(count):
    ...       save(step + 1); raise Preempted(step + 1)
  """

  def __init__(self):
    self._flag = threading.Event()
    self._uses_jax = False
    self._previous = None

  def __enter__(self) -> 'Notice':
    self._uses_jax = _jax_sync_available()
    if not self._uses_jax and threading.current_thread(
    ) is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
    return self

  def __exit__(self, *exc_info) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def _on_sigterm(self, signum, frame) -> None:
    del signum, frame
    self._flag.set()

  def reached(self, count: int) -> bool:
    """Whether to stop after the `count`-th step of this run (counts 1, 2, ...).

    Every process must call this once per step, with the same counts.
    """
    if self._uses_jax:
      return multihost_utils.reached_preemption_sync_point(count)
    return self._flag.is_set()
