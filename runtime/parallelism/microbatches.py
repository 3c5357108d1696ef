"""One step's global batch on any number of devices: microbatches and padding.

A step's G examples are cut into groups of m examples (m divides G), the
unit each device computes in one forward and backward pass. Device d runs
groups d*k .. d*k + k - 1, one after another (k microbatches, gradient
accumulation); groups from G / m on are padding, which never counts: the
step averages over the G / m real groups only (runtime/step.py). In rows:
device d holds global batch positions [d*k*m, (d+1)*k*m), the positions
from G on being padding, so each process still holds contiguous rows.

When G divides over the D devices and nothing asks for microbatches, m is G /
D, k is 1 and nothing is padded: the step of before, bit for bit. Groups of the
same size are the same groups on any topology (8 devices x 1 and 4 devices x 2
cut the batch alike), so a model with batch statistics (BatchNorm) computes the
same step on both; `microbatch_size` keeps the group size on any number of
devices (an elastic job keeps its first attempt's,
runtime/checkpoints/batch_limit.py). Random numbers do not depend on groups at
all: each example draws from its own key (runtime/step.py).

Example:
  >>> layout = plan(256, 24)             # 3 processes x 8 devices
  >>> layout.microbatch_size, layout.microbatches, layout.padded_groups
  (16, 1, 8)
  >>> plan(256, 8, device_batch_limit=16).microbatches
  2
"""

import dataclasses
import math
from typing import Optional

from runtime.common import exit_codes


class LayoutError(exit_codes.ConfigError):
  """No layout fits the global batch, the devices and the limits asked."""


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one step's examples sit on the devices.

  Attributes:
    global_batch_size: G, the examples of one step.
    num_devices: D, every device of every process.
    microbatch_size: m, the examples of one group (one pass of one device).
    microbatches: k, the groups each device runs one after another.
  """
  global_batch_size: int
  num_devices: int
  microbatch_size: int
  microbatches: int
  # Why this layout and not the plain one, for the layout line ('' if
  # plain): a remembered group size, or one dropped.
  note: str = dataclasses.field(default='', compare=False)

  @property
  def real_groups(self) -> int:
    return self.global_batch_size // self.microbatch_size

  @property
  def padded_groups(self) -> int:
    return self.num_devices * self.microbatches - self.real_groups

  @property
  def device_rows(self) -> int:
    """Rows each device holds: k x m."""
    return self.microbatches * self.microbatch_size

  @property
  def padding_share(self) -> float:
    """The share of the devices' passes that compute nothing."""
    return self.padded_groups / (self.num_devices * self.microbatches)

  def describe(self) -> str:
    text = (f'{self.microbatches} microbatch(es) of {self.microbatch_size} '
            f'example(s) per device')
    if self.padded_groups:
      text += (
          f', {self.padded_groups} of {self.num_devices * self.microbatches}'
          f' group(s) padding ({self.padding_share:.0%} of the passes)')
    return f'{text}; {self.note}' if self.note else text


def _divisors(n: int) -> list[int]:
  small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
  return sorted(set(small + [n // d for d in small]))


def _smallest_group(global_batch_size: int, groups_at_most: int) -> int:
  """The smallest m dividing G with at most `groups_at_most` groups."""
  return next(m for m in _divisors(global_batch_size)
              if global_batch_size // m <= groups_at_most)


def _fixed_group(global_batch_size: int, num_devices: int, microbatch_size: int,
                 device_batch_limit: Optional[int],
                 microbatches: Optional[int]) -> Layout:
  """The layout whose groups are `microbatch_size` examples, on any D."""
  if global_batch_size % microbatch_size or (
      device_batch_limit and microbatch_size > device_batch_limit):
    raise LayoutError(
        f'groups of {microbatch_size} examples (config.microbatch_size) '
        f'must divide global batch size {global_batch_size}' +
        (f' and be at most config.device_batch_limit={device_batch_limit}'
         if device_batch_limit else '') + '; choose a divisor of '
        f'{global_batch_size}')
  needed = math.ceil(global_batch_size // microbatch_size / num_devices)
  if microbatches and microbatches != needed:
    raise LayoutError(
        f'config.microbatches={microbatches} and config.microbatch_size='
        f'{microbatch_size}: global batch size {global_batch_size} on '
        f'{num_devices} devices in groups of {microbatch_size} takes '
        f'{needed} microbatch(es); set only one of the two')
  return Layout(global_batch_size, num_devices, microbatch_size, needed)


def plan(global_batch_size: int,
         num_devices: int,
         device_batch_limit: Optional[int] = None,
         microbatches: Optional[int] = None,
         microbatch_size: Optional[int] = None) -> Layout:
  """The layout with the fewest passes per device, then the least padding.

  Args:
    global_batch_size: G, examples per step over the whole job.
    num_devices: D, every device of every process.
    device_batch_limit: the most examples a device takes in one pass
      (config.device_batch_limit; None or 0: no limit).
    microbatches: k, the passes per device (config.microbatches; None or
      0: as few as the limit allows).
    microbatch_size: m, the examples of one group, the same on every D
      (config.microbatch_size, or an elastic job's first attempt's; None
      or 0: chosen as above). Statistics over a group (BatchNorm's) are
      then the same on any topology.

  Raises:
    LayoutError: naming G, D and the limits when none fits.
  """
  if global_batch_size <= 0 or num_devices <= 0:
    raise LayoutError(f'global batch size {global_batch_size} over '
                      f'{num_devices} devices: both must be positive')
  if microbatch_size:
    return _fixed_group(global_batch_size, num_devices, microbatch_size,
                        device_batch_limit, microbatches)
  if microbatches:
    m = _smallest_group(global_batch_size, microbatches * num_devices)
  else:
    fitting = [
        d for d in _divisors(global_batch_size)
        if not device_batch_limit or d <= device_batch_limit
    ]
    passes = math.ceil(global_batch_size / max(fitting) / num_devices)
    m = _smallest_group(global_batch_size, passes * num_devices)
    microbatches = passes
  if device_batch_limit and m > device_batch_limit:
    raise LayoutError(
        f'global batch size {global_batch_size} in {microbatches} '
        f'microbatch(es) on {num_devices} devices needs groups of {m} '
        f'examples (a divisor of {global_batch_size}), above '
        f'config.device_batch_limit={device_batch_limit}; raise '
        'config.microbatches or leave it 0 to let the limit choose')
  return Layout(global_batch_size, num_devices, m, microbatches)


def unpadded(global_batch_size: int,
             num_devices: int,
             device_batch_limit: Optional[int] = None,
             microbatches: Optional[int] = None) -> Optional[Layout]:
  """The layout with the fewest passes per device that pads nothing
  (k x m x D = G), within the limits; None when there is none (D does not
  divide G, or every such group is over the limit).

  Example:
    >>> unpadded(40, 8, device_batch_limit=4)   # plan() pads 6 of 16 here
    Layout(global_batch_size=40, num_devices=8, microbatch_size=1, microbatches=5)
  """
  if global_batch_size % num_devices:
    return None
  share = global_batch_size // num_devices
  for k in _divisors(share):
    m = share // k
    if microbatches and k != microbatches:
      continue
    if device_batch_limit and m > device_batch_limit:
      continue
    return Layout(global_batch_size, num_devices, m, k)
  return None


def batches_without_padding(global_batch_size: int,
                            num_devices: int) -> tuple[int, ...]:
  """The global batch sizes nearest G below and above that divide over D
  devices (one when G does), for messages."""
  below = global_batch_size // num_devices * num_devices
  if below == global_batch_size:
    return (global_batch_size,)
  return tuple(b for b in (below, below + num_devices) if b > 0)


def process_positions(layout: Layout, process_index: int,
                      local_device_count: int) -> tuple[slice, int]:
  """The positions of the padded global batch one process holds, and how
  many of them are real examples (the first ones).

  Example:
    >>> process_positions(plan(256, 6), 2, 2)   # 3 processes x 2 devices
    (slice(256, 384, None), 0)
  """
  rows = local_device_count * layout.device_rows
  start = process_index * rows
  real = max(0, min(layout.global_batch_size - start, rows))
  return slice(start, start + rows), real
