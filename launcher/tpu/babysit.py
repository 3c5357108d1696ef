"""Babysitting a slice this launch created: notice it is gone, bring it back.

While an attempt runs, `Watch` reads the queued resource every
--poll_interval seconds. Once a node is PREEMPTED (or TERMINATED), or the
queued resource is SUSPENDING, SUSPENDED or FAILED, the attempt ends at once
rather than waiting on ssh sessions to VMs that no longer exist. Before the
next attempt `recreate` deletes the queued resource, creates it again under
the same name, waits through its phases and sets the new VMs up; the job
then resumes from its checkpoint. The `Recreate` record it returns, the
attempt's `infrastructure` (`elastic.Ready`), carries that time into
attempts.jsonl, where the goodput roll-up counts it as infrastructure
recovery.
"""

import threading
import time
from typing import Callable, Optional, Protocol

from launcher.tpu import commands
from launcher.tpu import flags
from launcher.tpu import queued
from runtime.common import records


class Owner(Protocol):
  """What the slices (slices.py, elastic.py) and their babysitter use of
  the launch they belong to; launch.Launch is one.

  Attributes:
    options: the script's flags.
    gcloud: how to reach the slices.
    all_nodes: every slice's node, NAME-0 ... NAME-(N-1) (or NAME alone).
    workers: workers per slice, once described.
  """
  options: flags.PodFlags
  gcloud: commands.Gcloud
  all_nodes: tuple[str, ...]

  @property
  def workers(self) -> int:
    ...

  def say(self, message: str) -> None:
    ...

  def path(self, name: str) -> str:
    """The launch's log file `name`."""

  def interrupted(self) -> bool:
    ...

  def prepare(self, nodes: Optional[tuple[str, ...]] = None) -> None:
    """Sets slices up again (a recreated slice's VMs are empty)."""


class Watch:
  """A thread that calls `on_lost(observation)` once a slice is gone
  (`fleet`: a queued.Fleet, or anything with its `lost()` and `request`,
  as slices.Slices that are `watched`)."""

  def __init__(self, fleet, poll_s: float,
               on_lost: Callable[[queued.Observation],
                                 None], say: Callable[[str], None]):
    self._fleet = fleet
    self._poll_s = poll_s
    self._on_lost = on_lost
    self._say = say
    self._done = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self.lost_at: Optional[float] = None

  def __enter__(self) -> 'Watch':
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._done.set()
    self._thread.join(timeout=self._poll_s + 30)

  def _run(self) -> None:
    while not self._done.wait(self._poll_s):
      try:
        lost = self._fleet.lost()
      except Exception as e:  # pylint: disable=broad-except
        # A describe that fails once (network, quota) is not a lost slice.
        self._say(f'could not read queued resource '
                  f'{self._fleet.request.name}: {e}')
        continue
      if lost is not None:
        self.lost_at = time.time()
        self._on_lost(lost)
        return


def lost_within(launch, grace_s: float) -> Optional[queued.Observation]:
  """Reads the slice every --poll_interval for `grace_s` seconds; the
  observation once it shows lost, None if it stays up.

  A VM's shutdown reaches the job (SIGTERM, exit 75 or 143) before the node
  turns PREEMPTED; relaunching in between would cost an attempt.
  """
  launch.say(f'the job ended as a preemption does while the slice still '
             f'looks up: reading it for up to {grace_s:g} s '
             '(--relaunch_grace) before relaunching there')
  deadline = time.monotonic() + grace_s
  while True:
    if launch.interrupted():
      raise queued.Interrupted()
    lost = launch.slices.lost()
    if lost is not None or time.monotonic() >= deadline:
      return lost
    time.sleep(
        min(launch.options.poll_interval, max(0.0,
                                              deadline - time.monotonic())))


def recreate(launch: Owner, fleet: queued.Fleet,
             lost: queued.Observation) -> records.Recreate:
  """Deletes the lost slice, creates it again, waits for it and sets its
  workers up; returns what that took.

  Raises:
    queued.Interrupted: on SIGINT or SIGTERM meanwhile.
    LaunchError: when the new slice does not come up within its phases'
      timeouts.
  """
  began = time.time()
  launch.say(f'slice lost ({lost.describe()}): deleting queued resource '
             f'{fleet.request.name} and creating it again')
  fleet.delete('the slice is lost')
  if launch.interrupted():
    raise queued.Interrupted()
  requested = time.time()
  fleet.create()
  fleet.wait_up()
  up = time.time()
  launch.prepare()
  ready = time.time()
  recreated = records.Recreate(lost=lost.describe(),
                               began=began,
                               recreate_requested=requested,
                               up=up,
                               ready=ready,
                               seconds=ready - began)
  launch.say(f'slice {fleet.request.name} is back after {ready - began:.1f} '
             f's (delete and create {up - began:.1f} s, set-up '
             f'{ready - up:.1f} s): relaunching')
  return recreated
