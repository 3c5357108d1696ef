"""One attempt of the job on a Ray cluster, as the job agent drives it: a
placement group and actors of its own, the processes started, their output
relayed until all have ended, everything of it removed.

Example:
  >>> end = Attempt(options, 2, '3f2a9c', logs, capacity).run()
  >>> end.code, end.lost          # attempts.AttemptEnd
  (137, (2,))
"""

import os
import signal
import time
from typing import TYPE_CHECKING, Optional

from launcher import agent
from launcher import attempts
from launcher import signals
from launcher.ray import elastic
from launcher.ray import options as options_lib
from launcher.ray import output
from runtime.common import exit_codes
from runtime.common import goodput
from runtime.common import handoff
from runtime.common import layout
from runtime.common import records

if TYPE_CHECKING:  # Ray is imported where the attempt runs, not here.
  from launcher.ray import group as group_lib

_READ_EVERY_S = 0.2
_DRAIN_CHECK_EVERY_S = 1.0
# A rank silent this long once every other process has ended, one failing,
# is taken for lost with its node, before Ray declares the node dead (about
# 12 s here). Its failure is dated by its last answer, so it is the root
# cause, and 137 the code --retry_exit_codes sees: the bar is high enough
# that an actor merely slow on a loaded machine does not reach it. Sooner
# when its node's raylet takes no connection (raylets.py): then it is gone.
_SILENT_LOST_S = 5.0
# How often the raylet of a silent rank's node is asked while it answers.
_ASK_RAYLET_EVERY_S = 1.0


class Attempt:
  """The job once on `capacity.current` nodes; an attempts.Attempt.

  Args:
    options: podrun-ray's flags.
    start: its number within the job, and the agent's `should_grow`.
    job_id: the same for every attempt of the job.
    logs: the rank logs and job.json (output.Logs).
    capacity: how many processes it runs, and the fewest the job may
      (elastic.Capacity).
  """

  def __init__(self, options: options_lib.RayFlags, start: agent.Start,
               job_id: str, logs: output.Logs, capacity: elastic.Capacity):
    self.options = options
    self.number = start.number
    self._should_grow = start.should_grow
    self.job_id = job_id
    self.logs = logs
    self.capacity = capacity
    self.attempt_name = records.attempt_name(job_id, start.number)
    self.num_processes = capacity.current
    self._regrew = False  # Stopped at a step boundary to grow.
    self._fault: Optional[records.Fault] = None
    self._group: Optional['group_lib.Group'] = None
    self._signalled: list[int] = []
    self._silence = Silence()
    self._next_drain_check = 0.0

  @property
  def group(self) -> 'group_lib.Group':
    """The processes' placement group, once `run` reserved it."""
    if self._group is None:
      raise AssertionError(f'{self.attempt_name} has no group before it runs')
    return self._group

  def run(self) -> attempts.AttemptEnd:
    from launcher.ray import group as group_lib  # pylint: disable=g-import-not-at-top
    try:
      self._group = group_lib.Group.reserve(self.num_processes,
                                            self.options.resources_per_process,
                                            self.options.start_timeout_s)
    except group_lib.CapacityError as e:
      output.say(f'error: {e}')
      return self._end(exit_codes.POD_UNAVAILABLE)
    self.capacity.look = self._spare
    try:
      with signals.handled((signal.SIGINT, signal.SIGTERM), self._on_signal):
        self._start()
        code = self._monitor()
    finally:
      self.group.remove()
    return self._end(code, lost=tuple(sorted(self.group.lost)))

  def _end(self, code: int, lost: tuple[int, ...] = ()) -> attempts.AttemptEnd:
    """How the attempt ended; its steps are counted from the ledgers'
    high-water marks in the workdir."""
    steps = steps_done(self.logs.record, self.attempt_name)
    return attempts.AttemptEnd(code=code,
                               name=self.attempt_name,
                               processes=self.num_processes,
                               launcher_signalled=bool(self._signalled),
                               progressed=bool(steps),
                               counts_steps=True,
                               furthest_step=max(steps) if steps else None,
                               fault=self._fault,
                               regrew=self._regrew,
                               lost=lost)

  def _on_signal(self, signum, frame) -> None:
    del frame
    self._signalled.append(signum)

  def _start(self) -> None:
    group = self.group
    capacity = self.capacity
    # Every count of processes from --min_processes up: refused before
    # step 1 when the config cannot run on one of them.
    # The driver writes the roll-up and its attempts into the workdir, once
    # (layout.writer): a shared one at its end, a bucket's after its last
    # attempt (launcher_record.py). Process 0 writes neither.
    told = handoff.Handoff(
        job_id=self.job_id,
        attempt=self.attempt_name,
        launcher_record=True,
        elastic=((capacity.minimum,
                  capacity.full) if capacity.elastic else None))
    coordinator, pids = group.start(self.options.launcher_args, told,
                                    self.options.env)
    self.logs.start(
        self.number,
        records.Job(job_id=self.job_id,
                    launched_by='podrun-ray',
                    attempt=self.number,
                    attempt_name=self.attempt_name,
                    coordinator_address=coordinator,
                    ranks=tuple({
                        'rank': r,
                        'pid': p,
                        'node': n
                    } for r, (p, n) in enumerate(zip(pids, group.nodes))),
                    launcher={'ray_address': self.options.address}))
    output.say(f'attempt {self.number}: started {len(pids)} processes, one '
               f'a node, coordinator {coordinator}')

  def _monitor(self) -> int:
    """Relays output until every process has ended; the attempt's exit
    code: its root cause's (exit_codes.root_cause, every launcher's rule),
    else 0. Once the cause is known, or the driver was signalled, the
    others have --stop_grace to end before they are stopped."""
    group, grace = self.group, self.options.stop_grace_s
    # (when, exit code, process index, wall time) of each failure.
    failed: list[tuple[float, int, int, float]] = []
    cause, stop_at, forwarded = None, None, False
    while len(group.ended) < len(group.hosts):
      seen, began = set(group.ended), time.monotonic()
      for process_index, stream, line in group.read(_READ_EVERY_S):
        self.logs.write(process_index, stream, line)
      time.sleep(max(0.0, began + _READ_EVERY_S - time.monotonic()))
      now = time.monotonic()
      _judge_silent(group, self._silence, now)
      failed += [
          self._failure(r, now)
          for r in group.ended
          if r not in seen and group.ended[r] != exit_codes.OK
      ]
      for i in sorted(set(group.lost) - seen):
        output.say(f'rank {i} lost: its node {group.nodes[i][:12]} is '
                   f'gone ({group.lost[i]})')
      notice = self._notice(now) or (self._grow_due(now)
                                     if cause is None else None)
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
    # Every end known: a lost node's process, dated by its last answer,
    # may precede what its loss caused in the others (an abort, 134).
    root = exit_codes.root_cause([f[:2] for f in failed], 0.0, True)
    if root is not None and root != cause:
      self._fail(failed[root], say=False)
      _, code, process_index, _ = failed[root]
      if cause is not None:
        output.say(f'the root cause is rank {process_index}\'s exit code {code}'
                   f'{exit_codes.signal_suffix(code)}: its node went before '
                   'the others failed')
    return failed[root][1] if root is not None else exit_codes.OK

  def _failure(self, process_index: int,
               now: float) -> tuple[float, int, int, float]:
    """(when, exit code, process index, wall time) of a process that failed;
    a lost one's when is its node's last answer."""
    group = self.group
    when = (group.last_heard(process_index)
            if process_index in group.lost else now)
    return (when, group.ended[process_index], process_index,
            time.time() - (now - when))

  def _grow_due(self, now: float) -> Optional[str]:
    """Why the job should grow now: its capacity sees a node with a bundle
    free outside the group (elastic.Capacity.grow_due), once an
    attempt; None otherwise."""
    capacity = self.capacity
    if self._regrew or not self._should_grow(now):
      return None
    self._regrew = True
    return (f'{capacity.spare} node(s) with a bundle free outside the job: '
            f'growing from {capacity.current} process(es)')

  def _spare(self) -> int:
    """What the capacity's `look` asks: the live nodes outside the group
    with a bundle free, once this attempt trains."""
    if not steps_done(self.logs.record, self.attempt_name):
      # Before its first step a process may not yet take SIGTERM for a
      # notice to save: growing waits until this attempt trains.
      return 0
    return self.group.spare_nodes(self.options.resources_per_process)

  def _notice(self, now: float) -> Optional[str]:
    """Why every process should save and stop now: the driver was
    signalled, or a node of the job drains (checked every
    _DRAIN_CHECK_EVERY_S); None while neither."""
    if self._signalled:
      return f'got {signal.Signals(self._signalled[0]).name}'
    if now < self._next_drain_check:
      return None
    self._next_drain_check = now + _DRAIN_CHECK_EVERY_S
    draining = self.group.draining()
    if not draining:
      return None
    process_index = min(draining)
    deadline = draining[process_index]
    left = (f'deadline in {deadline / 1000 - time.time():.0f} s'
            if deadline else 'no deadline')
    node = self.group.nodes[process_index][:12]
    return f'rank {process_index}\'s node {node} is draining ({left})'

  def _fail(self,
            failure: tuple[float, int, int, float],
            say: bool = True) -> None:
    """Records the root cause as the attempt's fault; says so, and that
    the others stop, unless `say` is False."""
    _, code, process_index, wall = failure
    lost = process_index in self.group.lost
    self._fault = records.Fault(at=wall,
                                detected=time.time(),
                                process_index=process_index,
                                kind='lost' if lost else 'failed',
                                exit_code=code)
    if say:
      output.say(f'rank {process_index} ended with exit code {code}'
                 f'{exit_codes.signal_suffix(code)}; stopping the others in '
                 f'{self.options.stop_grace_s:g} s if they have not ended')


class Silence:
  """What the others were told of silent ranks: whose node may be gone
  (`gone`), and whose raylet was found gone too (`dead`, a subset), with
  when each silent rank's raylet was last asked."""

  def __init__(self):
    self.gone: set[int] = set()
    self.dead: set[int] = set()
    self.asked: dict[int, float] = {}

  def news(self, group, now: float) -> tuple[list[int], list[int]]:
    """(ranks newly silent, ranks newly found dead): a silent rank's
    raylet is asked at most once a second until it is found gone."""
    new = sorted(set(group.silent) - self.gone)
    dead = []
    for process_index in sorted(set(group.silent) - self.dead):
      if now - self.asked.get(process_index, -1e9) < _ASK_RAYLET_EVERY_S:
        continue
      self.asked[process_index] = now
      if group.raylet_gone(process_index):
        dead.append(process_index)
    self.gone.update(new)
    self.dead.update(dead)
    return new, dead


def _judge_silent(group, silence: Silence, now: float) -> None:
  """A rank whose node stops answering: the others hear at once that its
  host may be gone (their supervisors then take it for lost after a few
  seconds without a heartbeat, two once its raylet is found gone); once
  every other process has ended, one of them failing, it is taken for
  lost itself, without waiting for Ray's verdict.

  Args:
    group: the attempt's group.Group.
    silence: what the others were told so far; grows.
    now: time.monotonic().
  """
  from launcher.ray import group as group_lib  # pylint: disable=g-import-not-at-top
  new, dead = silence.news(group, now)
  if new or dead:
    if new:
      output.say(f'rank(s) {", ".join(map(str, new))} not answering for '
                 f'{group_lib.SILENT_AFTER_S:g} s: telling the others their '
                 'node may be gone')
    if dead:
      output.say(f'rank(s) {", ".join(map(str, dead))}: the node\'s raylet '
                 'takes no connection, so it is gone')
    # One reason for all; peers.Gone says "found dead" of the dead ones.
    group.tell_gone(sorted(silence.gone), 'its Ray node stopped answering',
                    tuple(sorted(silence.dead)))
  # Only after a failure: at a job's good end (every other process 0) a
  # slow answer waits for the node's own, or for Ray's verdict.
  failed = any(code != exit_codes.OK for code in group.ended.values())
  if failed and all(
      r in group.ended or r in group.silent for r in range(len(group.hosts))):
    for process_index, since in list(group.silent.items()):
      why = f'no answer from its node for {now - since:.1f} s'
      if now - since >= _SILENT_LOST_S:
        group.take_lost(process_index, why)
      elif process_index in silence.dead:
        group.take_lost(process_index, f'{why}, and its raylet takes no '
                        'connection')


def steps_done(record: layout.Record, attempt_name: str) -> list[int]:
  """The last step each process of attempt `attempt_name` completed, from
  the high-water marks among the workdir's ledgers; processes that
  completed none yet are left out."""
  marks = layout.ranks(os.path.join(record.ledgers(), attempt_name), '.step')
  return [
      step for step in (goodput.HighWater.read(m) for m in marks.values())
      if step > 0
  ]
