"""One attempt of a job on every worker of a TPU pod: its output and its end.

Runs one `gcloud ... ssh --worker=all` per slice running worker.py and
reads their lines (worker_lines.py: each worker's log, the console, each
worker's exit). The first failing worker, Ctrl-C (also a terminal's, which
kills gcloud and ssh with it) or SIGTERM stops the job on every worker. A
slice this launch created that is lost meanwhile (babysit.Watch) ends the
attempt at once with PREEMPTED.
"""

import contextlib
import signal
import subprocess
import threading
import time
from typing import Optional, Protocol

from launcher import agent
from launcher import attempts
from launcher import signals
from launcher.tpu import babysit
from launcher.tpu import commands
from launcher.tpu import ends
from launcher.tpu import flags
from launcher.tpu import slices as slices_lib
from launcher.tpu import worker_lines
from runtime.common import exit_codes
from launcher.common import flag_values
from runtime.common import layout
from runtime.common import records

# How long the output of ssh sessions to a lost slice is still read.
_LOST_PUMP_S = 5.0


class Context(Protocol):
  """All that an attempt, its worker lines and its babysitter use of the
  launch they belong to (launch.Launch is one).

  Attributes:
    job_id: the same on every attempt of the launch.
    launcher_args: the launcher's flags, as every worker gets them, read
      once.
    options: the script's flags (flags.py).
    gcloud: how to reach a slice's workers (commands.Gcloud).
    slices: what the job runs on (slices.Slices).
    signals: SIGINT or SIGTERM the launch got, in order.
    nodes: the slices the job runs on now, the coordinator's first.
    workers: workers per slice.
  """
  job_id: str
  launcher_args: flag_values.LaunchArgs
  options: flags.PodFlags
  gcloud: commands.Gcloud
  slices: slices_lib.Slices
  signals: list[int]

  @property
  def nodes(self) -> tuple[str, ...]:
    ...

  @property
  def workers(self) -> int:
    ...

  def say(self, message: str) -> None:
    ...

  def write(self, name: str, line: str) -> None:
    """Appends `line` to the launch's log file `name`."""

  def path(self, name: str) -> str:
    """The launch's log file `name`."""

  def run_command(self, attempt: int, slice_id: int = 0) -> str:
    """What every worker of slice `slice_id` runs for attempt `attempt`."""

  def prepare(self, nodes: Optional[tuple[str, ...]] = None) -> None:
    """Sets slices up again (a recreated slice's VMs are empty)."""

  def on_signal(self, signum, frame) -> None:
    ...

  def interrupted(self) -> bool:
    ...


class Attempt:
  """One run of the job on every worker of every slice: its output, its end,
  its stop; an attempts.Attempt.

  `run()` returns how it ended (attempts.AttemptEnd), whose code is the
  first failing worker's (a worker's 10, "another process failed", is never
  taken for the cause), PREEMPTED (75) when a slice this launch created is
  lost under it, or 128 + N when this driver got signal N.
  """

  def __init__(self, launch: Context, start: agent.Start):
    self.launch = launch
    self.number = start.number
    self._start = start
    self.attempt_name = commands.attempt_id(launch.job_id, start.number)
    # What bringing the slices back took before this attempt, if it had to.
    self.infrastructure: Optional[records.Recreate] = None
    self.slice_lost: Optional[str] = None
    self._lost_nodes: tuple[str, ...] = ()  # The lost slice's nodes.
    # Stopped at a step boundary for slices back (elastic.py).
    self.regrew = False
    self._processes = 0
    self._lines = worker_lines.WorkerLines(launch, start.number, self._stop)
    self._stopper: Optional[threading.Thread] = None
    self._lock = threading.Lock()
    self._signals: list[int] = []

  def run(self) -> attempts.AttemptEnd:
    launch = self.launch
    ready = self._start.ready
    self.infrastructure = ready.infrastructure
    if not ready:
      if launch.signals:
        self._signals.append(launch.signals[0])
        return self._end(exit_codes.SIGNAL_BASE + launch.signals[0])
      return self._end(exit_codes.POD_UNAVAILABLE)
    self._processes = launch.workers * len(launch.nodes)
    with signals.handled((signal.SIGINT, signal.SIGTERM), self._on_signal):
      clients = [
          subprocess.Popen(launch.gcloud.ssh(launch.run_command(self.number, s),
                                             node=node,
                                             workers=launch.workers),
                           stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
          for s, node in enumerate(launch.nodes)
      ]
      pumps = [
          threading.Thread(target=pump, args=(pipe,))
          for c in clients
          for pump, pipe in ((self._lines.pump, c.stdout),
                             (self._lines.pump_stderr, c.stderr))
      ]
      for t in pumps:
        t.start()
      self._follow(clients)
      if self._signals:
        # A terminal's Ctrl-C reaches gcloud and its ssh clients too, which
        # die at once and leave the remote jobs running: stop them.
        self._stop(f'got {signal.Signals(self._signals[0]).name}')
      for t in pumps:
        t.join(timeout=_LOST_PUMP_S if self.slice_lost else None)
      if self._stopper is not None:
        self._stopper.join()
      return self._end(self._code([c.returncode for c in clients]))

  def _end(self, code: int) -> attempts.AttemptEnd:
    """How the attempt ended. A lost slice is no fault of the job, nor is a
    stop to grow: either relaunches without backing off (`progressed`)."""
    launch = self.launch
    return attempts.AttemptEnd(code=code,
                               name=self.attempt_name,
                               processes=self._processes or
                               launch.workers * len(launch.nodes),
                               launcher_signalled=bool(self._signals),
                               progressed=self.slice_lost is not None or
                               self.regrew,
                               infrastructure=self.infrastructure,
                               regrew=self.regrew,
                               lost=tuple(self._lost_ids()))

  def _follow(self, clients: list[subprocess.Popen]) -> None:
    """Waits for every gcloud to end, stopping the job on a signal; ends
    them at once when the slice is lost under them."""
    launch = self.launch
    watch = (babysit.Watch(launch.slices, launch.options.poll_interval,
                           self._on_lost, launch.say)
             if launch.slices.watched else contextlib.nullcontext())
    with watch:
      while any(c.poll() is None for c in clients):
        if self._signals:
          self._stop(f'got {signal.Signals(self._signals[0]).name}')
        self._grow_if_due()
        if self.slice_lost is not None:
          self._let_the_lost_slice_end(clients)
          return
        time.sleep(0.1)

  def _grow_if_due(self) -> None:
    """Slices back (an elastic launch): every process saves the step they
    agree on, as on a preemption, and the attempt ends to grow."""
    if (self.regrew or self._stopper is not None or
        not self._start.should_grow(time.monotonic())):
      return
    self.regrew = True
    self._stop('slice(s) back and set up: saving at a step boundary to grow')

  def _let_the_lost_slice_end(self, clients: list[subprocess.Popen]) -> None:
    """Gives the job on a lost slice up to --lost_slice_wait seconds to end
    by itself (a preempted VM's job saves between the soft and the hard
    power-off, and deleting the slice would end it at once), then ends the
    gcloud sessions still open. It goes on as soon as the job has ended
    (ends.over): gcloud re-runs a session its VM's shutdown cut, so the
    lost slice's gcloud does not end by itself."""
    wait_s = self.launch.options.lost_slice_wait
    deadline = time.monotonic() + wait_s
    _tell_the_others(self.launch, self.attempt_name, self._lost_ids(),
                     self._lost_nodes, self.slice_lost or 'the slice is lost')
    if any(c.poll() is None for c in clients):
      self.launch.say(f'waiting up to {wait_s:g} s (--lost_slice_wait) for '
                      'the job on the lost slice to end (its preemption '
                      'save) before anything deletes it')
    url = self.launch.launcher_args.workdir or ''
    ledgers = (ends.Ledgers(url, self.attempt_name, self._lost_ids()).start()
               if layout.in_bucket(url) else None)
    try:
      while (any(c.poll() is None for c in clients) and
             time.monotonic() < deadline and not self._signals):
        over = self._job_over(ledgers)
        if over:
          self.launch.say(f'{over}: going on')
          break
        time.sleep(0.1)
    finally:
      if ledgers is not None:
        ledgers.stop()
    for c in clients:
      if c.poll() is None:
        c.terminate()  # gcloud alone; the VMs are going anyway.
    for c in clients:
      c.wait()

  def _lost_ids(self) -> list[int]:
    return [
        int(i)
        for i, node in _process_nodes(self.launch).items()
        if node in self._lost_nodes
    ]

  def _job_over(self, ledgers: Optional[ends.Ledgers] = None) -> Optional[str]:
    """Why nothing of the job can still be saving, or None (ends.over)."""
    url = self.launch.launcher_args.workdir or ''
    kept_in_bucket = layout.in_bucket(url) or any(
        '=gs://' in arg for arg in self.launch.launcher_args)
    return ends.over(
        {
            w: code for w, (_, code) in dict(self._lines.exits).items()
        }, _process_nodes(self.launch), {str(i) for i in self._lost_ids()},
        kept_in_bucket,
        ledgers.final() if ledgers else set(), url if ledgers else '')

  def _on_lost(self, lost) -> None:
    self.slice_lost = lost.describe()
    self._lost_nodes = lost.of
    self.launch.say(f'the slice is lost under job {self.launch.job_id}: '
                    f'{self.slice_lost}')

  def _on_signal(self, signum, frame) -> None:
    self._signals.append(signum)
    self.launch.on_signal(signum, frame)

  def _code(self, gcloud_codes: list[int]) -> int:
    if self._signals:
      return exit_codes.SIGNAL_BASE + self._signals[0]
    workers = self.launch.workers * len(self.launch.nodes)
    shutdown = self._lines.ended_as_a_shutdown_would(workers)
    if (self.slice_lost is None and self.launch.slices.watched and
        not self.regrew and (self._lines.cause is not None or shutdown)):
      # The VMs' shutdown can reach the job before the watch sees the
      # slice go, and a spot slice's node can show it seconds later still:
      # ask again (for --relaunch_grace on a spot slice) before taking the
      # job's own code, and relaunching on VMs that are going.
      lost = (babysit.lost_within(
          self.launch, self.launch.options.relaunch_grace) if shutdown and
              self.launch.options.spot else _lost_or_none(self.launch))
      if lost is not None:
        self._on_lost(lost)
    if self.slice_lost is not None:
      return exit_codes.PREEMPTED
    root = self._lines.root_cause()
    if root is not None:
      return root
    exits = len(self._lines.exits)
    gcloud_code = next((c for c in gcloud_codes if c), 0)
    if gcloud_code or exits != workers:
      self.launch.say(f'gcloud exited {gcloud_code} with {exits} '
                      f'of {workers} worker(s) reporting an exit code')
      self._stop('not every worker reported its end')
      if self._stopper is not None:
        self._stopper.join()
      return gcloud_code or exit_codes.FAILED
    return exit_codes.OK

  def _stop(self, why: str) -> None:
    with self._lock:
      if self._stopper is None:
        self._stopper = _stop_everywhere(self.launch, self.attempt_name, why)


def _stop_everywhere(launch, attempt_name: str, why: str) -> threading.Thread:
  """Stops the attempt's job on every worker (SIGTERM, then SIGKILL after
  --stop_grace) from a thread of its own, which it returns started."""
  launch.say(f'{why}: stopping job {launch.job_id} on every worker '
             f'(SIGTERM, then SIGKILL after {launch.options.stop_grace:g} s)')
  stop = commands.stop_command(attempt_name, launch.options.stop_grace)
  stopper = threading.Thread(target=_run_each,
                             daemon=True,
                             args=([
                                 launch.gcloud.ssh(stop,
                                                   node=n,
                                                   workers=launch.workers)
                                 for n in launch.nodes
                             ], launch.path('stop.log')))
  stopper.start()
  return stopper


def _run_each(gcloud_commands: list[list[str]], log_path: str) -> None:
  """Runs the commands at once, each in a session of its own: a second
  Ctrl-C from the terminal must not cut a stop short."""
  threads = [
      threading.Thread(target=commands.run_logged, args=(c, log_path, True))
      for c in gcloud_commands
  ]
  for t in threads:
    t.start()
  for t in threads:
    t.join()


def _tell_the_others(launch, attempt_name: str, lost: list[int],
                     lost_nodes: tuple[str, ...], why: str) -> None:
  """Tells the job on the other slices which processes' hosts went
  (peers.Gone): a process of the lost slice killed without a notice then
  ends the job within seconds, not after --heartbeat_timeout; one that
  saves (it beats meanwhile) is waited for as before."""
  others = [n for n in launch.nodes if n not in lost_nodes]
  if not lost or not others:
    return
  gone = commands.gone_command(attempt_name, lost, why)
  launch.say(f'telling the job on {", ".join(others)} that processes '
             f'{", ".join(map(str, lost))} are gone with their slice')
  threading.Thread(target=_run_each,
                   daemon=True,
                   name='tell-the-others',
                   args=([
                       launch.gcloud.ssh(gone, node=n, workers=launch.workers)
                       for n in others
                   ], launch.path('gone.log'))).start()


def _process_nodes(launch) -> dict[str, str]:
  """{process id: its slice's node} of an attempt on `launch.nodes`."""
  return {
      str(s * launch.workers + w): node for s, node in enumerate(launch.nodes)
      for w in range(launch.workers)
  }


def _lost_or_none(launch):
  """A slice seen lost once the job ended, or None; a read that gcloud
  fails is said and taken as none lost, so that the job's own end decides
  the attempt's (a bug raises)."""
  try:
    return launch.slices.lost()
  except exit_codes.PodrunError as e:
    launch.say(f'could not read the slices after the job ended: {e}')
    return None
