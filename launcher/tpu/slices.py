"""The slices a TPU launch runs its job on: one protocol, three kinds.

- `Standing`: slices this launch did not create (no --create). Nothing
  watches them; before a relaunch each must be able to come back (the
  preflight's reading of its state).
- `Babysat`: the queued resource this launch created (--create). An
  attempt ends at once when it is lost; before the next, it is deleted,
  created again and set up (babysit.py).
- `elastic.SliceGroup` (--create --min_slices): a queued resource a slice.
  The job goes on without a lost one and grows when it is back, as the one
  elastic policy decides (`resize`).

The driver and an attempt only ever hold a `Slices`, so neither asks which
kind it has.

Example:
  >>> slices = of(launch)         # launch.options.create, .min_slices
  >>> slices.create(); slices.wait_up()
  >>> slices.nodes()
  ('tpu-0', 'tpu-1')
"""

from typing import Optional, Protocol

from launcher import elastic as policy
from launcher.tpu import babysit
from launcher.tpu import elastic
from launcher.tpu import preflight as preflight_lib
from launcher.tpu import queued
from runtime.common import exit_codes


class Slices(Protocol):
  """What a launch does with its slices.

  Attributes:
    watched: whether `lost` can tell a lost slice (False: nothing was
      created that the launch can read).
    ours: whether the launch created something it may delete.
    up: whether what it created is up (True where it created nothing).
  """
  watched: bool

  @property
  def ours(self) -> bool:
    ...

  @property
  def up(self) -> bool:
    ...

  def nodes(self) -> tuple[str, ...]:
    """The slices the job runs on now, the coordinator's first."""

  def requests(self) -> list[queued.Request]:
    """The queued resources the launch creates (--dry_run, --stop)."""

  def created(self) -> list[str]:
    """The names of the queued resources this launch created."""

  def create(self) -> None:
    ...

  def wait_up(self) -> None:
    ...

  def lost(self) -> Optional[queued.Observation]:
    """A slice of the job seen lost, or None."""

  def delete(self, why: str) -> None:
    ...

  def ready(self, now: float) -> policy.Ready:
    """Before a relaunch: whether the job can run again; may bring slices
    back first, and says what that took."""

  def grow_due(self, now: float) -> bool:
    """Whether the running attempt should stop at a step boundary to grow."""


class _EverySlice:
  """Slices that all run every attempt: nothing to grow into."""

  def __init__(self, launch: babysit.Owner):
    self._launch = launch

  def nodes(self) -> tuple[str, ...]:
    return self._launch.all_nodes

  def grow_due(self, now: float) -> bool:
    del now
    return False


class Standing(_EverySlice):
  """Slices this launch did not create: run on as they are."""
  watched = False
  ours = False
  up = True

  def requests(self) -> list[queued.Request]:
    return []

  def created(self) -> list[str]:
    return []

  def create(self) -> None:
    pass

  def wait_up(self) -> None:
    pass

  def lost(self) -> Optional[queued.Observation]:
    return None

  def delete(self, why: str) -> None:
    del why

  def ready(self, now: float) -> policy.Ready:
    """Whether every slice can run the job again (its state as the
    preflight reads it; --skip_preflight: taken that it can)."""
    del now
    launch = self._launch
    if launch.options.skip_preflight:
      return policy.Ready(True)
    for node in self.nodes():
      try:
        ok, why = preflight_lib.recoverable(
            preflight_lib.make_client(node, launch.options.zone,
                                      launch.options.project or None))
      except Exception as e:  # pylint: disable=broad-except
        launch.say(preflight_lib.explain_api_error(node, e))
        return policy.Ready(False)
      if not ok:
        launch.say(f'TPU {node} {why}: cannot come back, not relaunching')
        return policy.Ready(False)
    return policy.Ready(True)


class Babysat(_EverySlice):
  """The queued resource this launch created, brought back when lost."""
  watched = True

  def __init__(self, launch: babysit.Owner, fleet: queued.Fleet):
    super().__init__(launch)
    self.fleet = fleet
    self.request = fleet.request  # babysit.Watch names it.

  @property
  def ours(self) -> bool:
    return self.fleet.ours

  @property
  def up(self) -> bool:
    return self.fleet.up

  def requests(self) -> list[queued.Request]:
    return [self.fleet.request]

  def created(self) -> list[str]:
    return [self.fleet.request.name]

  def create(self) -> None:
    self.fleet.create()

  def wait_up(self) -> None:
    self.fleet.wait_up()

  def lost(self) -> Optional[queued.Observation]:
    return self.fleet.lost()

  def delete(self, why: str) -> None:
    self.fleet.delete(why)

  def ready(self, now: float) -> policy.Ready:
    """The slice still stands, or it is recreated and set up (what that
    took is the Ready's `infrastructure`)."""
    del now
    launch = self._launch
    try:
      lost = self.fleet.lost()
      if lost is None:
        return policy.Ready(True)
      return policy.Ready(True, babysit.recreate(launch, self.fleet, lost))
    except queued.Interrupted:
      return policy.Ready(False)
    except exit_codes.PodrunError as e:
      launch.say(f'error: {e}')
      return policy.Ready(False)


def of(launch: babysit.Owner) -> Slices:
  """The kind of slices `launch.options` asks for (--create, --min_slices)."""
  options = launch.options
  if not options.create:
    return Standing(launch)
  timeouts = queued.Timeouts(options.capacity_timeout,
                             options.provisioning_timeout, options.wait_healthy)
  request = queued.Request(options.queued_resource, launch.all_nodes,
                           options.accelerator_type, options.runtime_version,
                           options.tier, options.valid_until)
  if options.min_slices:
    return elastic.SliceGroup(launch, request, timeouts, options.poll_interval,
                              launch.path('gcloud.log'), options.min_slices)
  return Babysat(
      launch,
      queued.Fleet(launch.gcloud, request, timeouts, options.poll_interval,
                   launch.path('gcloud.log'), launch.say, launch.interrupted))
