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
every process (process 0 decides). On a CPU it is 1: there the host's
cores run the step too, so a longer call saves no idle time.
"""

import math
from typing import Any, Callable, Mapping, Optional, Sequence

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
  wrong = {name: every for name, every in cadences.items()
           if every and every % k}
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


def choose(step_s: Optional[float], cadences: Mapping[str, int],
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
  common = fitting(cadences)
  return max(k for k in range(1, wanted + 1) if not common or common % k == 0)


def size_at(step: int, k: int, steps: int) -> int:
  """How many steps the dispatch starting after `step` runs: up to the next
  multiple of k, and not past `steps`."""
  return min(k - step % k, steps - step)


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
  then k is chosen (`decide`) and a second prefetcher serves the rest. Every
  process cuts the same dispatches: the switch is at a fixed step, and k is
  process 0's.

  Args:
    load: `(first step, steps) -> the dispatch's batch on the devices`.
    start, steps: the run's steps are start + 1 .. steps.
    k: steps per dispatch, or None for 'auto'.
    decide: `() -> k`, called once, by 'auto', at its switch.
    size: batches prepared ahead (config.prefetch).

  Example:
    >>> with Dispatches(load, 0, 100, 4, None, size=2) as dispatches:
    ...   steps, batch, waited_s = dispatches.next(0)
  """

  def __init__(self, load: Callable[[int, int], Any], start: int, steps: int,
               k: Optional[int], decide: Callable[[], int], size: int = 2):
    self._load, self._steps, self._size = load, steps, size
    self._decide = decide
    self.k = k
    self._switch = (steps if k is not None else
                    min(steps, start + AUTO_MEASURED_STEPS))
    self._prefetcher = self._open(start, self._switch, k or 1)

  def _open(self, start: int, stop: int, k: int) -> prefetch.Prefetcher:
    firsts = []
    step = start
    while step < stop:
      firsts.append((step, size_at(step, k, stop)))
      step += firsts[-1][1]
    return prefetch.Prefetcher(lambda first: self._load(*first), firsts,
                               size=self._size)

  def next(self, step: int) -> tuple[int, Any, float]:
    """(steps, batch, seconds waited) of the dispatch after `step`."""
    if step == self._switch and self.k is None:
      self._prefetcher.close()
      self.k = self._decide()
      self._prefetcher = self._open(step, self._steps, self.k)
    stop = self._switch if step < self._switch else self._steps
    first = (step, size_at(step, self.k or 1, stop))
    batch, waited = self._prefetcher.next(first)
    return first[1], batch, waited

  def close(self) -> None:
    self._prefetcher.close()

  def __enter__(self) -> 'Dispatches':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def decide_auto(cadences: Mapping[str, int], platform: str,
                step_s: Callable[[], Optional[float]],
                client: Optional[coordination.Client],
                step_bytes: Callable[[], int] = lambda: 0) -> int:
  """'auto's k: 1 on a CPU; else `choose` from process 0's step time and
  batch bytes a step, told to every process. Process 0 says what it
  chose."""
  if platform == 'cpu':
    return 1

  def decide() -> str:
    return str(choose(step_s(), cadences, step_bytes()))
  k = (int(decide()) if client is None or client.process_count == 1 else
       int(client.from_0(_DECISION_KEY, decide)))
  if jax.process_index() == 0:
    measured = step_s()
    logging.info('steps_per_dispatch=auto: %d step(s) per call from here '
                 '(a step took %s)', k,
                 'an unknown time' if measured is None else
                 f'{1000 * measured:.2f} ms')
  return k
