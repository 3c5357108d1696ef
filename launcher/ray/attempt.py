"""One attempt of the job on a Ray cluster, as restart.run drives it: a
placement group and actors of its own, the processes started, their output
relayed until all have ended, everything of it removed.

Example:
  >>> code = Attempt(options, number=2, job_id='3f2a9c', logs=logs).run()
"""

import os
import signal
import time
from typing import Optional

from launcher import restart
from launcher import signals
from launcher.ray import output
from runtime.common import exit_codes
from runtime.common import goodput
from runtime.common import layout
from runtime.common import records

_READ_EVERY_S = 0.2
_DRAIN_CHECK_EVERY_S = 1.0


class Attempt(restart.Attempt):
  """The job once on `options.num_processes` nodes.

  Args:
    options: podrun-ray's (driver.Options).
    number: 1, 2, ... within the job.
    job_id: the same for every attempt of the job.
    logs: the rank logs and job.json (output.Logs).
  """

  def __init__(self, options, number: int, job_id: str, logs: output.Logs):
    self.options = options
    self.number = number
    self.job_id = job_id
    self.logs = logs
    self.attempt_name = records.attempt_name(job_id, number)
    self.num_processes = options.num_processes
    # Steps are counted from the ledgers' high-water marks in the workdir.
    self.counts_steps = True
    self._group = None
    self._signalled: list[int] = []
    self._next_drain_check = 0.0

  def run(self) -> int:
    from launcher.ray import group as group_lib  # pylint: disable=g-import-not-at-top
    try:
      self._group = group_lib.Group.reserve(
          self.options.num_processes, self.options.resources_per_process,
          self.options.start_timeout_s)
    except group_lib.CapacityError as e:
      output.say(f'error: {e}')
      return exit_codes.POD_UNAVAILABLE
    try:
      with signals.handled((signal.SIGINT, signal.SIGTERM), self._on_signal):
        self._start()
        code = self._monitor()
    finally:
      self._group.remove()
    self._note_progress()
    return code

  def _on_signal(self, signum, frame) -> None:
    del frame
    self._signalled.append(signum)
    self.launcher_signalled = True

  def _start(self) -> None:
    group = self._group
    coordinator, pids = group.start(self.options.launcher_args, self.job_id,
                                    self.attempt_name)
    self.logs.start(self.number, {
        'job_id': self.job_id, 'attempt': self.number,
        'attempt_name': self.attempt_name,
        'coordinator_address': coordinator,
        'ray_address': self.options.address,
        'ranks': [{'rank': r, 'pid': p, 'node': n} for r, (p, n) in
                  enumerate(zip(pids, group.nodes))]})
    output.say(f'attempt {self.number}: started {len(pids)} processes, one '
               f'a node, coordinator {coordinator}')

  def _monitor(self) -> int:
    """Relays output until every process has ended; the attempt's exit
    code: its root cause's (exit_codes.root_cause, every launcher's rule),
    else 0. Once the cause is known, or the driver was signalled, the
    others have --stop_grace to end before they are stopped."""
    group, grace = self._group, self.options.stop_grace_s
    failed: list[tuple[float, int, int, float]] = []  # (when, code, rank, wall)
    cause, stop_at, forwarded = None, None, False
    while len(group.ended) < len(group.hosts):
      seen = set(group.ended)
      for rank, stream, line in group.read():
        self.logs.write(rank, stream, line)
      now = time.monotonic()
      failed += [(now, group.ended[r], r, time.time()) for r in group.ended
                 if r not in seen and group.ended[r] != exit_codes.OK]
      for rank in sorted(set(group.lost) - seen):
        output.say(f'rank {rank} lost: its node {group.nodes[rank][:12]} is '
                   f'gone ({group.lost[rank]})')
      notice = self._notice(now)
      if notice and not forwarded:
        output.say(f'{notice}: every process saves the step they agree on, '
                   'then the attempt ends')
        group.signal(signal.SIGTERM)  # The preemption notice.
        stop_at, forwarded = now + grace, True
      if cause is None:
        cause = exit_codes.root_cause([f[:2] for f in failed], now, False)
        if cause is not None:
          self._fail(failed[cause])
          stop_at = min(stop_at or now + grace, now + grace)
      if stop_at is not None and now > stop_at:
        group.stop(grace)
        stop_at = None
      time.sleep(_READ_EVERY_S)
    if cause is None:
      cause = exit_codes.root_cause([f[:2] for f in failed], 0.0, True)
    return failed[cause][1] if cause is not None else exit_codes.OK

  def _notice(self, now: float) -> Optional[str]:
    """Why every process should save and stop now: the driver was
    signalled, or a node of the job drains (checked every
    _DRAIN_CHECK_EVERY_S); None while neither."""
    if self._signalled:
      return f'got {signal.Signals(self._signalled[0]).name}'
    if now < self._next_drain_check:
      return None
    self._next_drain_check = now + _DRAIN_CHECK_EVERY_S
    draining = self._group.draining()
    if not draining:
      return None
    rank = min(draining)
    deadline = draining[rank]
    left = (f'deadline in {deadline / 1000 - time.time():.0f} s' if deadline
            else 'no deadline')
    return (f'rank {rank}\'s node {self._group.nodes[rank][:12]} is draining '
            f'({left})')

  def _fail(self, failure: tuple[float, int, int, float]) -> None:
    _, code, rank, wall = failure
    lost = rank in self._group.lost
    self.fault = records.Fault(at=wall, detected=wall, rank=rank,
                               kind='lost' if lost else 'failed',
                               exit_code=code)
    output.say(f'rank {rank} ended with exit code {code}'
               f'{exit_codes.signal_suffix(code)}; stopping the others in '
               f'{self.options.stop_grace_s:g} s if they have not ended')

  def _note_progress(self) -> None:
    """The furthest step a process of this attempt completed, from the
    high-water marks in the workdir's ledgers."""
    record = self.logs.record
    marks = layout.ranks(os.path.join(record.ledgers(), self.attempt_name),
                         '.step')
    steps = [goodput.HighWater.read(m) for m in marks.values()]
    self.furthest_step = max(steps) if steps else None
    self.progressed = bool(steps) and max(steps) > 0
