"""The job agent (launcher/agent.py): it alone asks a capacity `ready` and
`grow_due`, starts attempts again, and ends the record once."""

import pytest

from launcher import agent
from launcher import attempts
from launcher import elastic
from launcher import restart
from runtime.common import exit_codes
from runtime.common import records

pytestmark = pytest.mark.unit


class _Units:
  """What the agent asks of a capacity, counted."""

  def __init__(self, back_at: float = float('inf')):
    self.asked = []
    self.back_at = back_at

  def ready(self, now):
    self.asked.append('ready')
    return elastic.Ready(True,
                         records.Recreate('slice-a', 1.0, 2.0, 3.0, 4.0, 3.0))

  def grow_due(self, now):
    self.asked.append('grow_due')
    return now >= self.back_at


class _Attempt:

  def __init__(self, start, code, seen):
    self.start, self.code, self.seen = start, code, seen

  def run(self):
    self.seen.append(
        (self.start.number, bool(self.start.ready),
         self.start.ready.infrastructure, self.start.should_grow(5.0)))
    return attempts.AttemptEnd(self.code, progressed=True)


def test_the_agent_asks_ready_before_every_attempt_after_the_first(tmp_path):
  units, seen, ended = _Units(back_at=3.0), [], []
  codes = iter([exit_codes.PREEMPTED, exit_codes.PREEMPTED, 0])
  job = agent.Job(start=lambda s: _Attempt(s, next(codes), seen),
                  restarts=restart.RestartPolicy(2, 0, ()),
                  logs_dir=str(tmp_path),
                  capacity=units,
                  say=lambda line: None,
                  finish=ended.append)
  runner = agent.Agent(job)
  assert runner.run() == 0
  assert runner.state is agent.State.ENDED and ended == [0]
  # The first attempt starts without `ready`; each later one after it, with
  # what bringing units back took; `should_grow` asks the capacity.
  assert [(n, ok, bool(infra), grow) for n, ok, infra, grow in seen
         ] == [(1, True, False, True), (2, True, True, True),
               (3, True, True, True)]
  assert units.asked == ['grow_due', 'ready', 'grow_due', 'ready', 'grow_due']
  kept = records.read_attempts(str(tmp_path / 'attempts.jsonl'))
  assert [a.exit_code for a in kept] == [75, 75, 0]


def test_without_a_capacity_an_attempt_never_grows(tmp_path):
  seen = []
  job = agent.Job(start=lambda s: _Attempt(s, 0, seen),
                  restarts=restart.RestartPolicy(),
                  logs_dir=str(tmp_path))
  assert agent.run(job) == 0
  assert seen == [(1, True, None, False)]


def test_the_record_ends_once_even_when_an_attempt_raises(tmp_path):
  ended = []

  def start(begun):
    raise RuntimeError('a bug of ours')

  job = agent.Job(start=start,
                  restarts=restart.RestartPolicy(),
                  logs_dir=str(tmp_path),
                  finish=ended.append)
  with pytest.raises(RuntimeError):
    agent.run(job)
  assert ended == [exit_codes.FAILED]
