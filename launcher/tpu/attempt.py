"""One attempt of a job on every worker of a TPU pod: its output and its end.

Reads the lines of `gcloud ... ssh --worker=all` running worker.py: each
`[worker W #N] text` goes once (N counts the job's lines, which a worker
sends again after a reconnection) to LOG_DIR/worker_W.log and to the
console; `[worker W] podrun: exit CODE` ends that worker. The first failing
worker, Ctrl-C or SIGTERM stops the job on every worker.
"""

import re
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

from launcher import exit_codes
from launcher import signals
from launcher.tpu import commands

_LINE = re.compile(r'^\[worker (\d+|\?)(?: #(\d+))?\] ?(.*)$')
_EXIT = re.compile(r'^podrun: exit (\d+)$')


class Attempt:
  """One run of the job on every worker: its output, its end, its stop.

  `run()` returns the attempt's exit code: the first failing worker's
  (a worker's 10, "another process failed", is never taken for the cause),
  or 128 + N when this driver got signal N.
  """

  def __init__(self, launch, number: int):
    self.launch = launch
    self.number = number
    self.attempt_name = commands.attempt_id(launch.job_id, number)
    self.launcher_signalled = False
    self._exits: dict[str, int] = {}
    self._last_line: dict[str, int] = {}
    self._headed: set[str] = set()
    self._cause: Optional[int] = None
    self._stopper: Optional[threading.Thread] = None
    self._lock = threading.Lock()
    self._signals: list[int] = []

  def run(self) -> int:
    launch = self.launch
    if self.number > 1 and not launch.recoverable():
      return exit_codes.POD_UNAVAILABLE
    with signals.handled((signal.SIGINT, signal.SIGTERM), self._on_signal):
      gcloud = subprocess.Popen(
          launch.gcloud.ssh(launch.run_command(self.number)),
          stdin=subprocess.DEVNULL,
          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
      pumps = [threading.Thread(target=self._pump, args=(gcloud.stdout, out))
               for out in (sys.stdout,)] + [threading.Thread(
                   target=self._pump_stderr, args=(gcloud.stderr,))]
      for t in pumps:
        t.start()
      while gcloud.poll() is None:
        if self._signals:
          self._stop(f'got {signal.Signals(self._signals[0]).name}')
        time.sleep(0.1)
      for t in pumps:
        t.join()
      if self._stopper is not None:
        self._stopper.join()
      return self._code(gcloud.returncode)

  def _on_signal(self, signum, frame) -> None:
    del frame
    self._signals.append(signum)
    self.launcher_signalled = True

  def _code(self, gcloud_code: int) -> int:
    if self._signals:
      return exit_codes.SIGNAL_BASE + self._signals[0]
    if self._cause is not None:
      return self._cause
    if exit_codes.PEER_FAILED in self._exits.values():
      return exit_codes.PEER_FAILED
    workers = self.launch.workers
    if gcloud_code or len(self._exits) != workers:
      self.launch.say(f'gcloud exited {gcloud_code} with {len(self._exits)} '
                      f'of {workers} worker(s) reporting an exit code')
      self._stop('not every worker reported its end')
      if self._stopper is not None:
        self._stopper.join()
      return gcloud_code or exit_codes.FAILED
    return exit_codes.OK

  def _stop(self, why: str) -> None:
    with self._lock:
      if self._stopper is not None:
        return
      launch = self.launch
      launch.say(f'{why}: stopping job {launch.job_id} on every worker '
                 f'(SIGTERM, then SIGKILL after {launch.options.stop_grace:g}'
                 ' s)')
      command = launch.gcloud.ssh(commands.stop_command(
          commands.attempt_id(launch.job_id, self.number),
          launch.options.stop_grace))
      self._stopper = threading.Thread(
          target=commands.run_logged,
          args=(command, launch.path('stop.log')), daemon=True)
      self._stopper.start()

  def _pump(self, pipe, console) -> None:
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

  def _worker_line(self, worker: str, text: str, console) -> None:
    launch = self.launch
    log = f'worker_{worker}.log'
    if worker not in self._headed:
      self._headed.add(worker)
      launch.write(log, f'===== attempt {self.number} of job '
                   f'{launch.job_id} =====')
    launch.write(log, text)
    print(f'[worker {worker}] {text}', file=console, flush=True)
    exit_match = _EXIT.match(text)
    if exit_match:
      code = int(exit_match.group(1))
      self._exits[worker] = code
      if code not in (exit_codes.OK, exit_codes.PEER_FAILED) and (
          self._cause is None):
        self._cause = code
        launch.say(f'worker {worker} exited {code} first')
        self._stop(f'worker {worker} failed')

  def _pump_stderr(self, pipe) -> None:
    for raw in iter(pipe.readline, b''):
      line = raw.decode('utf-8', 'replace').rstrip('\n')
      match = _LINE.match(line)
      if match:
        self._worker_line(match.group(1), match.group(3), sys.stderr)
        continue
      self.launch.write('gcloud.log', line)
      print(line, file=sys.stderr, flush=True)
