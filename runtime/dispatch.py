"""Several steps per dispatch: which steps each call of the step runs.

A step of a few milliseconds leaves the device idle while the host does its
part of every step (the call, the batch, the loop's bookkeeping). With
config.steps_per_dispatch = k, one call runs k steps over k batches placed
at once (runtime/step.py, a `lax.scan`): the same updates, the same data
order and the same keys as k calls. The loop and its hooks then see only
every k-th step, so every cadence in steps must be a multiple of k, which
`check_cadences` holds before step 1.

A dispatch runs the steps up to the next multiple of k (or the last step):
a run resumed at another step, or one whose steps are not a multiple of k,
runs one shorter dispatch to get back in line.

Auto (0, or 'auto') runs the first AUTO_MEASURED_STEPS steps one by one on an
accelerator, then takes k from their measured time (`choose`), the same on
every process (process 0 decides). It then looks again after every
REVIEW_CALLS calls (`grow`): the time a step takes at one step a call and at
k tells the host's part of a step from the device's, and k grows until the
host's share of a call is at most HOST_SHARE, or the calls stop getting
faster. On a CPU it is 1: there the host's cores run the step too, so a
longer call saves no idle time.
"""

import math
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from absl import logging
import jax
import numpy as np

from runtime.common import exit_codes
from runtime import coordination
from runtime import prefetch

AUTO = 'auto'
# Steps run one per call before 'auto' decides: the first compiles, and
# the rest give the step time.
AUTO_MEASURED_STEPS = 20
# 'auto' takes k > 1 for steps under FAST_STEP_S, and makes one call last
# about TARGET_CALL_S at the one-step-a-call pace. That pace is the host's
# (the MNIST MLP on a TPU v5e: 1.6 ms a step, 0.28 ms of it the chip's), so
# the call is shorter once the host's part is shared: 40 ms picked k = 25
# there, which ran at 1.25x k = 10 (BUILD_NOTES.md, issue 71).
FAST_STEP_S = 0.005
TARGET_CALL_S = 0.04
MOST_STEPS = 64
# And a call's batches stay under MOST_CALL_BYTES on each host: on that
# host a call of 40 MB of batch ran at 0.36x one of 20 MB (k = 50 against
# 25), the time going to the host's copies and the transfer.
MOST_CALL_BYTES = 24 << 20
# Looking again: after REVIEW_CALLS calls at k, k grows while the host's
# share of a call is over HOST_SHARE, at most MOST_GROWTH times a look, to
# MOST_GROWN_STEPS, and stops once a longer call gained under MIN_GAIN. On
# the TPU v5e the MNIST MLP with its data on the chip ran at 0.24 of a
# resident scan at 25 steps a call, 0.51 at 100 and 0.69 at 500 (issue 82).
REVIEW_CALLS = 10
HOST_SHARE = 0.1
MOST_GROWTH = 8
MOST_GROWN_STEPS = 1000
MIN_GAIN = 0.05
MOST_REVIEWS = 4
# A call shorter than k is split into calls of sizes already compiled,
# up to this many calls (`cut`).
MOST_SPLIT_CALLS = 32
_DECISION_KEY = 'podrun/steps_per_dispatch'


class DispatchError(exit_codes.ConfigError):
  """config.steps_per_dispatch does not fit the config (exit 2)."""


def parse(value: Any) -> Optional[int]:
  """config.steps_per_dispatch as k, or None for auto (0 or 'auto').

  Raises:
    DispatchError: for anything but a count of at least 0 or 'auto'.
  """
  if value == AUTO:
    return None
  if isinstance(value, str) and value.isdigit():
    value = int(value)
  if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
    if value >= 0:
      return int(value) or None
  raise DispatchError(
      f'config.steps_per_dispatch={value!r}; it must be a whole number of '
      f'steps, at least 1, or 0 (or {AUTO!r}) to choose it from the '
      'measured step time')


def check_cadences(k: int, cadences: Mapping[str, int]) -> None:
  """Refuses, before step 1, a cadence in steps that k does not divide.

  Args:
    k: steps per dispatch.
    cadences: {config name: steps}; 0 is never, which any k fits.

  Raises:
    DispatchError: naming every cadence that is not a multiple of k.
  """
  wrong = {
      name: every for name, every in cadences.items() if every and every % k
  }
  if not wrong:
    return
  named = ', '.join(f'{name}={every}' for name, every in sorted(wrong.items()))
  raise DispatchError(
      f'config.steps_per_dispatch={k} runs {k} steps per call, and the loop '
      f'sees only every {k}th step, but {named} is not a multiple of {k}. '
      f'Set each to a multiple of {k}, or steps_per_dispatch to a divisor '
      'of each.')


def fitting(cadences: Mapping[str, int]) -> int:
  """The largest k that divides every cadence (0 for none)."""
  return math.gcd(*(every for every in cadences.values() if every))


def choose(step_s: Optional[float],
           cadences: Mapping[str, int],
           step_bytes: int = 0) -> int:
  """'auto's k from the measured step time: 1 for a step of FAST_STEP_S or
  more; else the largest k up to TARGET_CALL_S / step_s, MOST_STEPS and
  MOST_CALL_BYTES / step_bytes (this host's batch bytes a step) that
  divides every cadence.

  Example:
    >>> choose(0.0005, {'log_every': 10})
    10
    >>> choose(0.0016, {'log_every': 100}, step_bytes=803_840)
    25
  """
  if not step_s or step_s >= FAST_STEP_S:
    return 1
  wanted = min(MOST_STEPS, math.ceil(TARGET_CALL_S / step_s))
  if step_bytes:
    wanted = max(1, min(wanted, MOST_CALL_BYTES // step_bytes))
  return _fitting_at_most(wanted, cadences)


def _fitting_at_most(wanted: int, cadences: Mapping[str, int]) -> int:
  """The largest k up to `wanted` that divides every cadence."""
  common = fitting(cadences)
  return max(k for k in range(1, wanted + 1) if not common or common % k == 0)


def host_share(k: int, one_step_s: float,
               k_step_s: float) -> Optional[tuple[float, float]]:
  """(the host's seconds a call, the device's a step) from a step's time at
  one step a call and at k a call, or None where k is 1 or the longer call
  was no faster.

  The model: a call costs the host h once and the device d a step, so a
  step takes h + d at one a call and h / k + d at k.

  Example:
    >>> [round(x, 6) for x in host_share(10, 1.1e-3, k_step_s=0.2e-3)]
    [0.001, 0.0001]
  """
  if k <= 1 or k_step_s >= one_step_s:
    return None
  host_s = (one_step_s - k_step_s) * k / (k - 1)
  return host_s, max(one_step_s - host_s, 0.0)


def grow(k: int,
         one_step_s: Optional[float],
         k_step_s: Optional[float],
         cadences: Mapping[str, int],
         step_bytes: int = 0) -> int:
  """k for the next calls, from a step's time at one a call and at k: the
  smallest k whose host share is at most HOST_SHARE, up to MOST_GROWTH x k,
  MOST_GROWN_STEPS and MOST_CALL_BYTES, dividing every cadence; k itself
  where the host's share is already small, the longer call gained under
  MIN_GAIN, or nothing larger fits. Where the k wanted divides no
  cadence, the next larger that does, or the largest within the bounds.

  Example:
    >>> grow(25, one_step_s=1.6e-3, k_step_s=0.35e-3,
    ...      cadences={'log_every': 100})  # 40 wanted.
    50
  """
  if not one_step_s or not k_step_s:
    return k
  if k_step_s > (1 - MIN_GAIN) * one_step_s:
    return k
  shares = host_share(k, one_step_s, k_step_s)
  if shares is None:
    return k
  host_s, device_s = shares
  if host_s / k <= HOST_SHARE * k_step_s:
    return k
  wanted = (math.ceil(host_s * (1 - HOST_SHARE) / (HOST_SHARE * device_s))
            if device_s > 0 else MOST_GROWN_STEPS)
  most = min(MOST_GROWTH * k, MOST_GROWN_STEPS)
  if step_bytes:
    most = min(most, MOST_CALL_BYTES // step_bytes)
  common = fitting(cadences)
  fits = [n for n in range(k + 1, most + 1) if not common or common % n == 0]
  if not fits:
    return k
  return min((n for n in fits if n >= wanted), default=fits[-1])


def size_at(step: int, k: int, steps: int) -> int:
  """How many steps the dispatch starting after `step` runs: up to the next
  multiple of k, and not past `steps`."""
  return min(k - step % k, steps - step)


def cut(start: int, stop: int, k: int,
        known: set[int]) -> Iterator[tuple[int, int]]:
  """The calls that run steps start + 1 .. stop at k a call, each
  `(first step, steps)`, cut as they are asked for: up to each multiple of
  k. A shorter call (getting in line, or the run's tail) of a size not run
  before is made of the sizes in `known` instead, where that takes at most
  MOST_SPLIT_CALLS calls: a new size is a new program to compile (0.3 s for
  the MNIST MLP on a TPU v5e, where a call costs the host about 1 ms).
  `known` gains the sizes cut. Nothing here grows with stop - start: a run
  of 10^12 steps starts as fast as one of 10.

  Example:
    >>> list(cut(2300, 2344, 100, {1, 25, 100}))  # 44 = 25 + 19 x 1.
    [(2300, 25), (2325, 1), (2326, 1), ..., (2343, 1)]
  """
  step = start
  while step < stop:
    n = size_at(step, k, stop)
    parts = _of_known(n, known) if n < k and n not in known else None
    if not parts:
      parts = [n]
      known.add(n)
    for part in parts:
      yield step, part
      step += part


def _of_known(n: int, known: set[int]) -> Optional[list[int]]:
  """n steps as calls of `known` sizes, largest first; None where they do
  not add up to n, or take more than MOST_SPLIT_CALLS calls."""
  parts: list[int] = []
  for size in sorted(known, reverse=True):
    while n - sum(parts) >= size and len(parts) < MOST_SPLIT_CALLS:
      parts.append(size)
  return parts if sum(parts) == n else None


def stack(batches: Sequence[Any], local_devices: int) -> Any:
  """The host batches of consecutive steps as one, for a dispatch of
  len(batches) steps: each device's rows of every step, in step order.

  Args:
    batches: pytrees of numpy arrays, each leaf (n, ...), this process's
      rows of one step, device by device (n / local_devices each).
    local_devices: this process's devices.

  Returns:
    The pytree with leaves (steps x n, ...): device 0's rows of step 1,
    of step 2, ..., then device 1's; `put_batch` gives each device its
    (steps x n / local_devices) rows, which the step splits by step.
  """
  if len(batches) == 1:
    return batches[0]
  steps = len(batches)

  def one(*leaves):
    x = np.stack(leaves)  # (steps, n, ...)
    x = x.reshape((steps, local_devices, -1) + x.shape[2:]).swapaxes(0, 1)
    return x.reshape((-1,) + x.shape[3:])

  return jax.tree_util.tree_map(one, *batches)


class Dispatches:
  """The run's dispatches, each `(first step, steps)`, prepared ahead.

  With a fixed k the whole run is one prefetched sequence. With 'auto' the
  first AUTO_MEASURED_STEPS steps run one per call from a first prefetcher;
  then k is chosen (`auto.first`) and a second prefetcher serves the calls
  up to the next look (`auto.again`, after REVIEW_CALLS calls, at a
  multiple of k), and so on while k grows. Every process cuts the same
  dispatches: each switch is at a step fixed by the k before it, and each k
  is process 0's.

  Args:
    load: `(first step, steps) -> the dispatch's batch on the devices`.
    start, steps: the run's steps are start + 1 .. steps.
    k: steps per dispatch, or None for 'auto'.
    auto: 'auto''s decisions (`Auto`); used only where k is None.
    size: batches prepared ahead (config.prefetch).

  Example:
    >>> with Dispatches(load, 0, 100, 4, None, size=2) as dispatches:
    ...   steps, batch, waited_s = dispatches.next(0)
  """

  def __init__(self,
               load: Callable[[int, int], Any],
               start: int,
               steps: int,
               k: Optional[int],
               auto: Optional['Auto'],
               size: int = 2):
    self._load, self._steps, self._size = load, steps, size
    self._auto = auto if k is None else None
    self.k = k or 1
    self._looks = 0
    self._switch = (steps if self._auto is None else min(
        steps, start + AUTO_MEASURED_STEPS))
    self._known: set[int] = set()  # The sizes of call cut so far.
    self._prefetcher = self._open(start, self._switch, self.k)

  def _open(self, start: int, stop: int,
            k: int) -> prefetch.Prefetcher[tuple[int, int]]:
    # The prefetcher's thread cuts the calls as it reaches them, and each
    # comes back with its batch: no list of the run's calls is ever made.
    return prefetch.Prefetcher(lambda first: self._load(*first),
                               cut(start, stop, k, self._known),
                               size=self._size)

  def _next_switch(self, step: int, looking: bool) -> int:
    """Where 'auto' looks again: a multiple of k, REVIEW_CALLS calls on;
    the run's end once it stops looking."""
    at = -(-(step + REVIEW_CALLS * self.k) // self.k) * self.k
    return at if looking and at < self._steps else self._steps

  def next(self, step: int) -> tuple[int, Any, float]:
    """(steps, batch, seconds waited) of the dispatch after `step`."""
    if step == self._switch and self._switch < self._steps:
      assert self._auto is not None  # Only 'auto' switches before the end.
      self._prefetcher.close()
      k = (self._auto.first() if not self._looks else self._auto.again(
          self.k, step))
      # It looks again while k grows (a k of 1 was a slow step).
      looking = k > 1 and k != self.k and self._looks < MOST_REVIEWS
      self.k, self._looks = k, self._looks + 1
      self._switch = self._next_switch(step, looking)
      self._prefetcher = self._open(step, self._switch, self.k)
    (first, steps), batch, waited = self._prefetcher.take()
    assert first == step, (first, step)
    return steps, batch, waited

  def close(self) -> None:
    self._prefetcher.close()

  def __enter__(self) -> 'Dispatches':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


class Auto:
  """'auto''s k, decided on process 0 and told to every process.

  Args:
    cadences: {config name: steps} that k must divide.
    platform: 'cpu' keeps k at 1.
    step_s: `(last) -> the median of the newest `last` step intervals`
      (per step, over calls of any k), None before any.
    client: the job's coordination client, None for one process.
    step_bytes: `() -> this host's batch bytes a step` (0: none from the
      host).
  """

  def __init__(self,
               cadences: Mapping[str, int],
               platform: str,
               step_s: Callable[[int], Optional[float]],
               client: Optional[coordination.Client],
               step_bytes: Callable[[], int] = lambda: 0):
    self._cadences, self._platform = cadences, platform
    self._step_s, self._client, self._step_bytes = step_s, client, step_bytes
    self.one_step_s: Optional[float] = None

  def _agreed(self, key: str, decide: Callable[[], int]) -> int:
    if self._client is None or self._client.process_count == 1:
      return decide()
    return int(self._client.from_0(key, lambda: str(decide())))

  def first(self) -> int:
    """k after the steps run one a call: 1 on a CPU; else `choose` from
    process 0's step time and batch bytes a step."""
    if self._platform == 'cpu':
      return 1
    self.one_step_s = self._step_s(AUTO_MEASURED_STEPS - 1)
    k = self._agreed(
        _DECISION_KEY,
        lambda: choose(self.one_step_s, self._cadences, self._step_bytes()))
    if jax.process_index() == 0:
      logging.info(
          'steps_per_dispatch=auto: %d step(s) per call from here '
          '(a step took %s)', k, _ms(self.one_step_s))
    return k

  def again(self, k: int, step: int) -> int:
    """k after REVIEW_CALLS calls at k (`grow`); process 0 says a change."""
    if self._platform == 'cpu':
      return k
    k_step_s = self._step_s(REVIEW_CALLS - 1)

    def decide() -> int:
      return grow(k, self.one_step_s, k_step_s, self._cadences,
                  self._step_bytes())

    grown = self._agreed(f'{_DECISION_KEY}/{step}', decide)
    if grown != k and jax.process_index() == 0:
      # grow changes k only from two timings where the longer call gained.
      assert self.one_step_s and k_step_s
      shares = host_share(k, self.one_step_s, k_step_s)
      assert shares is not None
      host_s = shares[0]
      logging.info(
          'steps_per_dispatch=auto: %d step(s) per call from step '
          '%d, where %d took %s a step against %s at one a call: '
          'the host\'s share of a call was %.2f', grown, step, k, _ms(k_step_s),
          _ms(self.one_step_s), host_s / k / k_step_s)
    return grown


def _ms(seconds: Optional[float]) -> str:
  return 'an unknown time' if seconds is None else f'{1000 * seconds:.2f} ms'
