"""The background batch preparer: order, errors, stopping."""

import itertools
import threading

import pytest

from runtime import prefetch

pytestmark = pytest.mark.unit


def test_batches_come_in_step_order_and_ahead_of_time():
  made = []
  ready = threading.Event()

  def make(step):
    made.append(step)
    if len(made) == 3:
      ready.set()
    return {'step': step}

  with prefetch.Prefetcher(make, range(5, 10), size=2) as batches:
    # With a buffer of 2, the thread prepares 2 batches and holds a third.
    assert ready.wait(10)
    for step in range(5, 10):
      batch, waited = batches.next(step)
      assert batch == {'step': step} and waited >= 0
  assert made == list(range(5, 10))


def test_an_error_is_raised_at_its_step():

  def make(step):
    if step == 2:
      raise OSError('disk gone')
    return step

  with prefetch.Prefetcher(make, range(5)) as batches:
    assert batches.next(0)[0] == 0
    assert batches.next(1)[0] == 1
    with pytest.raises(OSError, match='disk gone'):
      batches.next(2)


def test_close_stops_an_endless_stream():
  batches = prefetch.Prefetcher(lambda step: step, itertools.count(), size=1)
  assert batches.next(0)[0] == 0
  batches.close()
  assert not batches._thread.is_alive()  # pylint: disable=protected-access


def test_asking_past_the_last_step_fails():
  with prefetch.Prefetcher(lambda step: step, range(1)) as batches:
    batches.next(0)
    with pytest.raises(AssertionError, match='step 1'):
      batches.next(1)


def test_a_step_out_of_order_fails():
  with prefetch.Prefetcher(lambda step: step, range(3)) as batches:
    with pytest.raises(AssertionError, match='step 1 asked'):
      batches.next(1)
