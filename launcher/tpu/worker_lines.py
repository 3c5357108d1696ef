"""The lines every worker of one TPU attempt sends, filed and judged.

Each `[worker W #N] text` that worker.py relays through gcloud goes once
(N counts the job's lines, which a worker sends again after a
reconnection) to LOG_DIR/worker_W.log, and to the console when W is 0 or
the line is a warning or an error; `[worker W] podrun: exit CODE` ends that
worker. Once the exits name a root cause (exit_codes.root_cause, every
launcher's rule), `on_failure` is told, once.

Example:
  >>> lines = WorkerLines(launch, number=2, on_failure=attempt.stop)
  >>> threading.Thread(target=lines.pump, args=(gcloud.stdout,)).start()
  >>> lines.exits   # {'0': (monotonic time, 0), '3': (..., 137)}
"""

import re
import signal
import sys
import time
from typing import Callable, Optional

from launcher.common import output_prefix
from runtime.common import exit_codes

_LINE = re.compile(r'^\[worker (\d+|\?)(?: #(\d+))?\] ?(.*)$')
_EXIT = re.compile(r'^podrun: exit (\d+)$')


class WorkerLines:
  """Files and shows one attempt's worker lines and keeps their exits.

  Args:
    launch: what the attempt uses of its launch (attempt.Context).
    number: the attempt's, 1, 2, ...
    on_failure: told once, with why, when a worker fails first.

  Attributes:
    exits: {worker: (monotonic time, exit code)} for each worker that
      reported its end.
    cause: the root cause's exit code, once known, else None.
  """

  def __init__(self, launch, number: int, on_failure: Callable[[str], None]):
    self.launch = launch
    self.number = number
    self.exits: dict[str, tuple[float, int]] = {}
    self.cause: Optional[int] = None
    self._on_failure = on_failure
    self._last_line: dict[str, int] = {}
    self._headed: set[str] = set()

  def pump(self, pipe, console=sys.stdout) -> None:
    """Reads gcloud's stdout to its end."""
    for raw in iter(pipe.readline, b''):
      line = raw.decode('utf-8', 'replace').rstrip('\n')
      match = _LINE.match(line)
      if not match:
        self.launch.write('gcloud.log', line)
        print(line, file=console, flush=True)
        continue
      worker, number, text = match.groups()
      if number is not None:
        if int(number) <= self._last_line.get(worker, 0):
          continue  # Seen before a reconnection.
        self._last_line[worker] = int(number)
      elif text == 'podrun: alive':
        continue
      self._worker_line(worker, text, console)

  def pump_stderr(self, pipe) -> None:
    """Reads gcloud's stderr to its end."""
    for raw in iter(pipe.readline, b''):
      line = raw.decode('utf-8', 'replace').rstrip('\n')
      match = _LINE.match(line)
      if match:
        self._worker_line(match.group(1), match.group(3), sys.stderr)
        continue
      self.launch.write('gcloud.log', line)
      print(line, file=sys.stderr, flush=True)

  def root_cause(self) -> Optional[int]:
    """The exit code of the first failure that is no consequence of
    another, once every worker has ended; None when none failed."""
    failed = [(at, code) for at, code in self.exits.values() if code]
    root = exit_codes.root_cause(failed, time.monotonic(), all_exited=True)
    return None if root is None else failed[root][1]

  def ended_as_a_shutdown_would(self, workers: int) -> bool:
    """SIGTERM's codes (75 after a save, or 143) from a worker, or fewer
    than `workers` said how their job ended (sessions cut)."""
    codes = {code for _, code in self.exits.values()}
    return bool(codes &
                {exit_codes.PREEMPTED, exit_codes.SIGNAL_BASE +
                 signal.SIGTERM}) or (len(self.exits) < workers)

  def _worker_line(self, worker: str, text: str, console) -> None:
    launch = self.launch
    log = f'worker_{worker}.log'
    if worker not in self._headed:
      self._headed.add(worker)
      launch.write(
          log, f'===== attempt {self.number} of job '
          f'{launch.job_id} =====')
    launch.write(log, text)
    exit_match = _EXIT.match(text)
    shown = ((worker == '0' and not output_prefix.routine(text)) or
             output_prefix.alarming(text) or
             (exit_match and exit_match.group(1) != '0'))
    if shown or launch.options.log_all_workers:
      print(f'[worker {worker}] {text}', file=console, flush=True)
    if exit_match:
      self.exits[worker] = (time.monotonic(), int(exit_match.group(1)))
      self._judge_exits()

  def _judge_exits(self) -> None:
    """Tells `on_failure` once the root cause is known."""
    if self.cause is not None:
      return
    failed = [
        (worker, at, code) for worker, (at, code) in self.exits.items() if code
    ]
    root = exit_codes.root_cause([(at, code) for _, at, code in failed],
                                 time.monotonic(),
                                 all_exited=False)
    if root is not None:
      worker, _, self.cause = failed[root]
      self.launch.say(f'worker {worker} exited {self.cause} first')
      self._on_failure(f'worker {worker} failed')
