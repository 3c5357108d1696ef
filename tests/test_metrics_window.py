"""The step line's window (runtime/metrics.py Window): its rates give the
steps' pace over at least a second of steps, less the loop's own pauses, so
that lines of one short call do not give the host's jitter (issue 85)."""

import random

import numpy as np
import pytest

from runtime import metrics

pytestmark = pytest.mark.unit


class Pauses:
  """The loop thread's pauses so far, as goodput.StepClock.paused_here."""

  def __init__(self):
    self.seconds = 0.0

  def __call__(self) -> float:
    return self.seconds


def _losses(steps: int) -> dict[str, np.ndarray]:
  return {'loss': np.ones(steps)}


def test_lines_of_one_short_call_give_the_pace_not_the_jitter():
  """100 steps a call, a call every 2 ms on the device, each retired when
  the host gets to it: 0-8 ms late, and never before the one before it. A
  line a call: each call's own interval varies over 10x, the lines' rates
  by under 2 %."""
  rng = random.Random(0)
  window = metrics.Window()
  intervals, rates = [], []
  retired = 0.0
  for call in range(2000):
    done_on_device = call * 0.002
    now = max(retired, done_on_device + rng.uniform(0.0, 0.008))
    intervals.append(now - retired)
    retired = now
    window.add(_losses(100), 100, now)
    if call >= 600:  # A second and more into the run.
      rates.append(window.rates(global_batch_size=8)['steps_per_sec'])
    window.reset()
  positive = [i for i in intervals[600:] if i > 0]
  assert max(positive) > 10 * min(positive)
  assert max(rates) < 1.02 * min(rates)
  assert rates[-1] == pytest.approx(100 / 0.002, rel=0.01)


def test_a_window_a_second_long_is_its_own_span():
  """Slow steps, then a line over 2 s of faster ones: that line gives the
  faster pace alone."""
  window = metrics.Window()
  now = 0.0
  for _ in range(21):  # 10 steps/s, a line at the end.
    now += 0.1
    window.add(_losses(1), 1, now)
  window.rates(1)
  window.reset()
  for _ in range(200):  # 100 steps/s for 2 s.
    now += 0.01
    window.add(_losses(1), 1, now)
  assert window.rates(1)['steps_per_sec'] == pytest.approx(100.0)
  assert window.timed_steps == 200


def test_pauses_in_the_span_are_not_steps():
  """A 30-s save between two calls, in a span of short calls: the pace is
  the steps'."""
  pauses = Pauses()
  window = metrics.Window(pauses)
  now = 0.0
  for call in range(400):
    now += 0.01
    if call == 300:
      now += 30.0
      pauses.seconds += 30.0
    window.add(_losses(10), 10, now)
    window.reset()
  window.add(_losses(10), 10, now + 0.01)
  assert window.rates(1)['steps_per_sec'] == pytest.approx(1000.0)


def test_the_first_call_is_left_out_and_the_input_wait_shares_the_span():
  window = metrics.Window()
  window.waited(5.0)  # Before the first call is timed: start-up.
  window.add(_losses(10), 10, 100.0)
  assert window.rates(1) == {}
  window.waited(0.5)
  window.add(_losses(10), 10, 102.0)
  rates = window.rates(global_batch_size=4)
  assert rates == pytest.approx({
      'steps_per_sec': 5.0,
      'examples_per_sec': 20.0,
      'input_wait_fraction': 0.25
  })
  assert window.means() == {'loss': 1.0}


def test_the_marks_kept_stay_few_without_lines():
  """With log_every=0 no line resets the window: it keeps only the marks a
  span of a second needs."""
  window = metrics.Window()
  for call in range(100_000):
    window.add(_losses(1), 1, call * 0.001)
  assert len(window._marks) <= 1002
  assert window.rates(1)['steps_per_sec'] == pytest.approx(1000.0)


def test_the_wait_for_a_new_programs_first_batch_is_a_pause():
  """A new steps-per-call size: the loop waits 0.5 s for its first batch
  (the prefetch thread compiles its gather). That wait is not the steps'
  pace; a later call's wait is."""
  window = metrics.Window()
  window.add(_losses(1), 1, 0.0)
  window.waited(0.5, new_program=True)
  now = 0.5
  for _ in range(10):
    now += 0.01
    window.waited(0.001)
    window.add(_losses(10), 10, now)
  rates = window.rates(1)
  assert rates['steps_per_sec'] == pytest.approx(1000.0)
  assert rates['input_wait_fraction'] == pytest.approx(0.1)
