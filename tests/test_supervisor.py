"""The per-process supervisor's decisions, without processes: what it names."""

import threading
import time

import pytest

from launcher.process import end_of_job
from launcher.process import peers
from launcher.process import supervisor
from runtime.common import exit_codes
from runtime.common import progress
from runtime.common import records
from tests import memory_job

pytestmark = pytest.mark.unit


def _record(begun, done=None, host='h', own=None, step=None, count=20):
  return {
      'begun': begun,
      'done': done,
      'host': host,
      'own': {
          'median': own,
          'count': count
      },
      'step': {
          'median': step
      }
  }


def test_cause_lines_name_rank_host_and_code():
  failed = records.Fault('failed', 1, 'host-b', 7, 'ValueError: bad')
  assert failed.describe() == ('rank 1 on host-b failed first: exit 7 '
                               '(ValueError: bad)')
  lost = records.Fault('lost', 2, 'host-c', summary='no heartbeat for 16 s')
  assert lost.describe() == 'rank 2 on host-c was lost: no heartbeat for 16 s'
  assert end_of_job.decode(end_of_job.encode(failed)) == failed


def test_a_ctrl_c_or_sigterm_is_no_fault_of_the_process_that_got_it():
  ctrl_c = records.Fault('failed', 0, 'host-a', 130, 'KeyboardInterrupt')
  assert ctrl_c.describe() == ('rank 0 on host-a was stopped by SIGINT '
                               '(Ctrl-C) (exit 130), not by a fault')
  assert 'failed' not in records.Fault('failed', 0, 'h', 143).describe()


def test_the_rank_that_did_not_start_the_step_is_the_laggard():
  records = {
      0: _record(13, 12, 'a'),
      1: _record(12, 12, 'b'),
      2: _record(13, 12, 'c')
  }
  assert peers.describe_laggards(records, 3) == (
      'laggards: rank 1 on b (started step 12, while rank 0 started step 13)')


def test_no_laggard_when_all_started_the_same_step_and_silent_ranks_named():
  records = {0: _record(5, 5), 1: _record(5, 5)}
  assert peers.describe_laggards(records, 3) == (
      'no rank is behind: every rank started step 5; no heartbeat ever from '
      'rank 2')
  # Before any step, a rank that never started one is behind.
  assert peers.describe_laggards({
      0: _record(1),
      1: _record(None, host='x')
  }, 2).startswith('laggards: rank 1 on x (started step 0')


def test_straggler_needs_both_the_ratio_and_a_share_of_the_step():
  slow = {
      0: _record(1, own=0.001, step=0.1),
      1: _record(1, own=0.09, step=0.1),
      2: _record(1, own=0.002, step=0.1)
  }
  warnings = peers.straggler_warnings(slow)
  assert [rank for rank, _ in warnings] == [1]
  assert 'straggler: rank 1 on h spends 0.090 s of its own per step' in (
      warnings[0][1])
  # 3x the others, but 0.2 ms of a 100 ms step: noise, not a straggler.
  tiny = {
      0: _record(1, own=0.0001, step=0.1),
      1: _record(1, own=0.0003, step=0.1)
  }
  assert peers.straggler_warnings(tiny) == []


def test_a_transport_error_waits_for_the_peers_cause():
  options = supervisor.WatchFlags(heartbeat_timeout=15)
  assert supervisor._consequence_wait_s(  # pylint: disable=protected-access
      'JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: Connection reset by '
      'peer', options) == 17
  assert supervisor._consequence_wait_s(  # pylint: disable=protected-access
      'ValueError: bad', options) < 1


_FakeJob = memory_job.MemoryJob


def test_a_silent_peer_is_declared_lost_and_everyone_exits_10():
  client = _FakeJob(process_index=0, process_count=2)
  exited = []
  done = threading.Event()
  # The stall watch off: this process completes no step, and only the
  # heartbeat is under test.
  sup = supervisor.Supervisor(client,
                              supervisor.WatchFlags(heartbeat_timeout=1.5,
                                                    stall_timeout=0,
                                                    first_step_timeout=0),
                              host='h0',
                              exit_process=lambda code:
                              (exited.append(code), done.set()))
  sup.start()
  assert done.wait(10), 'rank 1 was never declared lost'
  sup.stop()
  cause = end_of_job.decode(client.store[end_of_job.END_KEY])
  assert (cause.kind, cause.process_index) == ('lost', 1)
  assert exited == [exit_codes.PEER_FAILED]


def test_a_process_the_launcher_saw_go_is_lost_after_a_few_silent_seconds(
    tmp_path):
  client = _FakeJob(process_index=0, process_count=3)
  watch = peers.Peers(client, 'h0', heartbeat_timeout=60)
  gone_file = tmp_path / 'gone'
  assert peers.gone(str(gone_file)) == peers.Gone()
  gone_file.write_text('{"processes": [2], "why": "node n-1 PREEMPTED"}')
  gone = peers.gone(str(gone_file))

  def beats(one, two):
    client.set(f'{peers.BEAT_DIR}/1', f'{{"beat": {one}, "host": "h1"}}', True)
    client.set(f'{peers.BEAT_DIR}/2', f'{{"beat": {two}, "host": "h2"}}', True)

  beats(1, 1)
  assert watch.find_lost(100.0, gone) is None  # First sight of both.
  beats(2, 1)
  assert watch.find_lost(102.0, gone) is None  # 2 s: not yet.
  beats(3, 1)
  # Rank 2 went silent with its host; rank 1, silent as long, is not
  # named, nor would rank 2 be without the launcher's word (60 s).
  assert watch.find_lost(103.5, peers.Gone()) is None
  lost = watch.find_lost(103.6, gone)
  assert (lost.kind, lost.process_index, lost.host) == ('lost', 2, 'h2')
  assert lost.summary == (
      'no heartbeat for 4 s (--heartbeat_timeout=60), and the launcher saw '
      'its host go (node n-1 PREEMPTED); its last completed step was None')
  # A process named gone that still beats (saving the agreed step with the
  # others after its notice) stays in the job.
  watch = peers.Peers(client, 'h0', heartbeat_timeout=60)
  for second in range(10):
    beats(second, second)
    assert watch.find_lost(200.0 + second, gone) is None
  gone_file.write_text('not json')
  assert peers.gone(str(gone_file)) == peers.Gone()


def test_a_process_whose_host_the_launcher_found_dead_is_lost_at_once(tmp_path):
  client = _FakeJob(process_index=0, process_count=3)
  watch = peers.Peers(client, 'h0', heartbeat_timeout=60)
  gone_file = tmp_path / 'gone'
  # Only a process named gone can be dead: 1 is not taken on the word.
  gone_file.write_text('{"processes": [2], "dead": [1, 2], '
                       '"why": "its raylet takes no connection"}')
  gone = peers.gone(str(gone_file))
  assert (gone.processes, gone.dead) == ({2}, {2})
  for process_index in (1, 2):
    client.set(f'{peers.BEAT_DIR}/{process_index}',
               f'{{"beat": 1, "host": "h{process_index}"}}', True)
  assert watch.find_lost(100.0, gone) is None  # First sight of both.
  client.set(f'{peers.BEAT_DIR}/1', '{"beat": 2, "host": "h1"}', True)
  # Two beats missed are enough for a dead host's process (3 for one gone,
  # --heartbeat_timeout for the rest).
  assert watch.find_lost(100.0 + peers.DEAD_SILENCE_S, gone) is None
  lost = watch.find_lost(100.1 + peers.DEAD_SILENCE_S, gone)
  assert (lost.kind, lost.process_index) == ('lost', 2)
  assert lost.summary == (
      'no heartbeat for 2 s (--heartbeat_timeout=60), and the launcher found '
      'its host dead (its raylet takes no connection); its last completed '
      'step was None')


def test_process_0_waits_for_no_ack_from_processes_the_launcher_saw_go(
    tmp_path, monkeypatch):
  client = _FakeJob(process_index=0, process_count=4)
  client.set(f'{end_of_job.ACK_DIR}/1', '1')
  end = end_of_job.EndOfJob(client)
  lost = records.Fault('lost', 2, 'h2')
  gone_file = tmp_path / 'gone'
  gone_file.write_text('{"processes": [2, 3]}')
  monkeypatch.setenv('PODRUN_GONE_FILE', str(gone_file))
  # Rank 3 went with rank 2's slice: no ack is awaited from it (the wait
  # would run out its 60 s otherwise).
  monkeypatch.setattr(end_of_job, '_ACK_WAIT_S', 60.0)
  started = time.monotonic()
  end.wait_for_acks(lost)
  assert time.monotonic() - started < 30
  # Without the launcher's word, rank 3's ack is awaited to the end.
  monkeypatch.setattr(end_of_job, '_ACK_WAIT_S', 0.5)
  monkeypatch.delenv('PODRUN_GONE_FILE')
  started = time.monotonic()
  end.wait_for_acks(lost)
  assert time.monotonic() - started >= 0.5


def test_the_own_watchdog_publishes_a_stall_and_dumps_stacks():
  client = _FakeJob(process_index=1, process_count=2)
  exited, dumped = [], []
  done = threading.Event()
  sup = supervisor.Supervisor(client,
                              supervisor.WatchFlags(first_step_timeout=1),
                              host='h1',
                              exit_process=lambda code:
                              (exited.append(code), done.set()),
                              dump_stacks=lambda: dumped.append(True))
  sup.start()
  assert done.wait(10)
  sup.stop()
  cause = end_of_job.decode(client.store[end_of_job.END_KEY])
  assert (cause.kind, cause.process_index) == ('stalled', 1)
  assert 'no first step completed within 1 s' in cause.summary
  assert exited == [exit_codes.STALLED] and dumped == [True]


@pytest.mark.parametrize('first_is_consequence', [True, False])
def test_fail_keeps_its_code_unless_another_failed_first(first_is_consequence):
  client = _FakeJob(process_index=1, process_count=2)
  sup = supervisor.Supervisor(client, supervisor.WatchFlags(), host='h1')
  if first_is_consequence:
    client.set(
        end_of_job.END_KEY,
        end_of_job.encode(records.Fault('failed', 0, 'h0', 7, 'SystemExit(7)')))
    assert sup.fail(1, 'RuntimeError: x',
                    may_be_consequence=True) == (exit_codes.PEER_FAILED)
  else:
    assert sup.fail(3, 'TopologyMismatchError: x',
                    may_be_consequence=False) == 3
    assert end_of_job.decode(client.store[end_of_job.END_KEY]).exit_code == 3


def test_no_straggler_is_judged_from_the_warm_up():
  # A first-steps own time of 1 s (a prefetcher starting) would make this
  # rank a straggler against one whose own time is 1 ms.
  for step in range(1, progress.WARMUP_STEPS + 1):
    progress.begin(step, own_seconds=1.0)
  assert progress.snapshot().own_seconds == []
  for step in range(progress.WARMUP_STEPS + 1, progress.WARMUP_STEPS + 31):
    progress.begin(step, own_seconds=0.001)
  own = progress.snapshot().own_seconds
  assert own == [0.001] * 30
  quick = {'own': progress.summarize(own), 'step': {'median': 0.1}}
  assert peers.straggler_warnings({0: quick, 1: quick}) == []


def test_process_0_waits_for_the_ack_of_the_process_whose_failure_won(
    monkeypatch):
  # Process 1's failure is published while it is still inside its own
  # publish; were process 0 to exit then, JAX would abort process 1 (-6)
  # before it wrote its records or its exit code (seen once in CI).
  store = memory_job.MemoryStore()
  one = supervisor.Supervisor(_FakeJob(1, 2, store),
                              supervisor.WatchFlags(),
                              host='h1')
  assert one.fail(3, 'TopologyMismatchError: x', may_be_consequence=False) == 3
  zero = end_of_job.EndOfJob(_FakeJob(0, 2, store))
  won = end_of_job.decode(store.values[end_of_job.END_KEY])
  monkeypatch.setattr(end_of_job, '_ACK_WAIT_S', 0.5)
  started = time.monotonic()
  zero.wait_for_acks(won)
  assert time.monotonic() - started >= 0.5  # No ack yet: waited it out.
  one.leave()  # Process 1's last act, once its records are written.
  monkeypatch.setattr(end_of_job, '_ACK_WAIT_S', 60.0)
  started = time.monotonic()
  zero.wait_for_acks(won)
  assert time.monotonic() - started < 30


def test_after_a_preemption_process_0_leaves_once_the_others_have(monkeypatch):
  # A preemption publishes no end: without this wait, process 0 could exit
  # (and its service with it) while another still writes its records.
  store = memory_job.MemoryStore()
  zero, one, two = (supervisor.Supervisor(_FakeJob(i, 3, store),
                                          supervisor.WatchFlags(),
                                          host=f'h{i}') for i in range(3))
  monkeypatch.setattr(end_of_job, '_ACK_WAIT_S', 0.5)
  one.leave()
  started = time.monotonic()
  zero.leave()
  assert time.monotonic() - started >= 0.5  # Process 2 never acknowledged.
  two.leave()
  monkeypatch.setattr(end_of_job, '_ACK_WAIT_S', 60.0)
  started = time.monotonic()
  zero.leave()
  assert time.monotonic() - started < 30
