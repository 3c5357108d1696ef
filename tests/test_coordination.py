"""The cross-process rounds of `coordination.Rounds`, threads as processes."""

import concurrent.futures
import json

import pytest

from runtime import coordination
from tests import memory_job

pytestmark = pytest.mark.unit


def _run(count, round_fn, absent=()):
  """round_fn(job) on `count` threads sharing one store; {rank: result or
  the error raised}. Ranks in `absent` never take part."""
  store = memory_job.MemoryStore()
  jobs = [memory_job.MemoryJob(i, count, store) for i in range(count)]
  present = [j for j in jobs if j.process_index not in absent]
  with concurrent.futures.ThreadPoolExecutor(len(present)) as pool:
    futures = {j.process_index: pool.submit(round_fn, j) for j in present}
  out = {}
  for rank, future in futures.items():
    error = future.exception()
    out[rank] = error if error is not None else future.result()
  return out, store


def test_decide_on_0_gives_everyone_the_verdict_on_all_values():
  decided_on = []

  def decide(published):
    decided_on.append(dict(published))
    return json.dumps(sorted(published.values()))

  out, _ = _run(
      3, lambda client: client.decide_on_0(
          'podrun/t', f'v{client.process_index}', decide, timeout_s=5))
  assert decided_on == [{0: 'v0', 1: 'v1', 2: 'v2'}]  # Once, on process 0.
  assert out == {r: '["v0", "v1", "v2"]' for r in range(3)}


def test_a_process_that_never_publishes_is_named():
  out, _ = _run(3,
                lambda client: client.decide_on_0(
                    'podrun/t', 'x', lambda published: 'ok', timeout_s=0.5),
                absent=(2,))
  assert isinstance(out[0], coordination.BarrierTimeout)
  assert out[0].missing == [2]
  # The others wait for a verdict that never comes, and name process 0.
  assert isinstance(out[1], coordination.BarrierTimeout)
  assert out[1].missing == [0]


def test_from_0_is_made_once_and_read_everywhere():
  made = []
  out, _ = _run(
      4, lambda client: client.from_0(
          'podrun/id', lambda: made.append(1) or 'job-7', timeout_s=5))
  assert made == [1]
  assert out == {r: 'job-7' for r in range(4)}


def test_from_0_names_process_0_when_it_is_missing():
  out, _ = _run(
      2,
      lambda client: client.from_0('podrun/id', lambda: 'x', timeout_s=0.3),
      absent=(0,))
  assert isinstance(out[1], coordination.BarrierTimeout)
  assert out[1].missing == [0]


def test_exchange_returns_every_process_value():
  out, _ = _run(
      3, lambda client: client.exchange('podrun/steps',
                                        str(10 * client.process_index), 5))
  assert out == {r: {0: '0', 1: '10', 2: '20'} for r in range(3)}


def test_by_rank_reads_only_the_values_right_under_the_prefix():
  client = memory_job.MemoryJob(0, 2)
  client.set('podrun/x/0', 'a')
  client.set('podrun/x/1', 'b')
  client.set('podrun/x/verdict', 'v')
  client.set('podrun/x/published/arrived/1', 't')
  client.set('podrun/xy/0', 'other round')
  assert client.by_process('podrun/x') == {0: 'a', 1: 'b'}
