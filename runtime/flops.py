"""What the chip does: FLOPs per step, TFLOP/s per device, MFU, tokens/s.

FLOPs per step come from XLA's cost analysis of the compiled step (what the
devices run, recomputation included), or from the workload's own figure
(`Task.flops_per_example`: the model's FLOPs, what MaxText and levanter call
MFU's numerator). The peak is the device kind's dense bf16 figure from
`PEAK_FLOPS`; a kind not in it has no MFU, and the log says so once.

Example:
  >>> step = flops.Measured(jitted_step)          # reads FLOPs on 1st call
  >>> figures = flops.Figures('TPU v5 lite', 1, lambda: step.flops_per_device)
  >>> figures.rates(steps_per_sec=15.9)
  {'tflops_per_device': 86.1, 'mfu': 0.437}
"""

import dataclasses
import re
from typing import Any, Callable, Optional

from absl import logging
import jax

from runtime import memory as memory_lib

# Dense bf16 FLOP/s of one TPU JAX device, by a piece of its device_kind
# (lower case), the more specific first. A v2 or v3 chip shows as two JAX
# devices (one per TensorCore); a v4 or v5p chip as one (megacore).
PEAK_FLOPS = (
    ('tpu v2', 22.5e12),
    ('tpu v3', 61.5e12),
    ('tpu v4', 275e12),
    ('tpu v5 lite', 197e12),
    ('tpu v5e', 197e12),
    ('tpu v5p', 459e12),
    ('tpu v5', 459e12),
    ('tpu v6 lite', 918e12),
    ('tpu v6e', 918e12),
    ('tpu7x', 2307e12),
)

# NVIDIA GPUs: (name, pattern the whole kind must match once 'NVIDIA ' or
# 'Tesla ' is taken off and it is lower-cased, dense bf16 FLOP/s, dense
# fp8 FLOP/s or None), by the datasheets. The kind is the CUDA device name
# (`nvidia-smi -L`); a substring would take an L40S for an L4 or an H100
# NVL for an SXM part, so each pattern is the whole name.
GPU_PEAKS = (
    ('H100 SXM', r'h100( sxm\S*)?( \d+gb)?( hbm3)?', 989e12, 1979e12),
    ('H100 PCIe', r'h100 pcie( \d+gb)?', 756e12, 1513e12),
    ('H100 NVL', r'h100 nvl', 835e12, 1671e12),
    ('H200 SXM', r'h200( sxm\S*)?( \d+gb)?', 989e12, 1979e12),
    ('H200 NVL', r'h200 nvl', 835e12, 1671e12),
    ('GH200', r'gh200( \d+gb)?', 989e12, 1979e12),
    ('A100 40GB', r'a100[- ](sxm4[- ]|pcie[- ])?40gb( pcie)?', 312e12, None),
    ('A100 80GB', r'a100[- ](sxm4[- ]|pcie[- ])?80gb( pcie)?', 312e12, None),
    ('A100', r'a100', 312e12, None),
    ('L4', r'l4', 121e12, 242e12),
    ('L40', r'l40', 181e12, 362e12),
    ('L40S', r'l40s', 362e12, 733e12),
    ('B200', r'b200', 2250e12, 4500e12),
    ('A10', r'a10', 125e12, None),
    ('V100', r'v100[- ]\S+', 125e12, None),
)


@dataclasses.dataclass(frozen=True)
class Peak:
  """The FLOP/s an MFU is taken against, and what it is.

  Attributes:
    flops: FLOP/s of one JAX device.
    what: for the line that says it, e.g. 'NVIDIA H200, dense bf16' or
      'config.peak_tflops'.
  """
  flops: float
  what: str


def _gpu_kind(device_kind: str) -> Optional[tuple[str, float, Optional[float]]]:
  kind = re.sub(r'^(nvidia|tesla) ', '', device_kind.strip().lower())
  for name, pattern, bf16, fp8 in GPU_PEAKS:
    if re.fullmatch(pattern, kind):
      return name, bf16, fp8
  return None


def peak_of(device_kind: str,
            measured_tflops: Optional[float] = None,
            fp8: bool = False) -> Optional[Peak]:
  """The peak an MFU is against: `measured_tflops` (config.peak_tflops, a
  ceiling measured on the machine) where given; else the kind's dense bf16
  figure (fp8: its fp8 figure); None for an unknown kind.

  Example:
    >>> peak_of('NVIDIA L40S')
    Peak(flops=362000000000000.0, what='NVIDIA L40S, dense bf16')
  """
  if measured_tflops:
    return Peak(measured_tflops * 1e12, 'config.peak_tflops')
  gpu = _gpu_kind(device_kind)
  if gpu is not None:
    name, bf16, fp8_flops = gpu
    if fp8 and fp8_flops:
      return Peak(fp8_flops, f'NVIDIA {name}, dense fp8')
    return Peak(bf16, f'NVIDIA {name}, dense bf16')
  kind = device_kind.lower()
  for piece, peak in PEAK_FLOPS:
    if piece in kind:
      return Peak(peak, f'{device_kind}, dense bf16')
  return None


def peak_flops(device_kind: str) -> Optional[float]:
  """A device kind's dense bf16 FLOP/s per JAX device, or None if unknown.

  Example:
    >>> peak_flops('TPU v5 lite')
    197000000000000.0
  """
  peak = peak_of(device_kind)
  return peak.flops if peak else None


def compiled_flops(fn: Any, *args) -> Optional[float]:
  """FLOPs one device runs in one call of jitted or pmapped `fn` on `args`,
  from XLA's cost analysis of the compiled program; None where the backend
  gives none.

  The compilation is the one the call itself then uses (JAX caches it in
  the process), so asking costs no second compile.

  Raises:
    What tracing or compiling `fn` raises.
  """
  return _flops_of(fn.lower(*args).compile())


def _flops_of(compiled: Any) -> Optional[float]:
  try:
    cost = compiled.cost_analysis()
  except Exception as e:  # pylint: disable=broad-except
    logging.info('no FLOPs from the compiled step: %s: %s', type(e).__name__, e)
    return None
  if isinstance(cost, (list, tuple)):  # Older JAX: one dict per program.
    cost = cost[0] if cost else {}
  value = float((cost or {}).get('flops', 0.0))
  return value if value > 0 else None


class Measured:
  """A jitted step whose first call reads the compiled program's FLOPs per
  device (`flops_per_device`) and the memory it needs of each device
  (`memory`, said once by process 0, with whether it fits the device),
  then runs it; `lower` goes through, so the program agreement can lower
  it too."""

  def __init__(self, step_fn: Any):
    self._fn = step_fn
    self.flops_per_device: Optional[float] = None
    self.memory: Optional[memory_lib.StepMemory] = None
    self._asked = False

  def lower(self, *args):
    return self._fn.lower(*args)

  def __call__(self, *args):
    if not self._asked:
      self._asked = True
      # A mistake in the step, or a compilation that fails, is raised here
      # as the call itself would raise it. The compiled program is let go
      # before the call loads its own: a TPU reserves a loaded program's
      # memory, and two of a big step do not fit.
      compiled = self._fn.lower(*args).compile()
      self.flops_per_device = _flops_of(compiled)
      self.memory = memory_lib.of_compiled(compiled)
      del compiled
      if self.memory is not None and jax.process_index() == 0:
        fits, line = memory_lib.verdict(self.memory, memory_lib.device_limit())
        (logging.info if fits else logging.warning)('%s', line)
    return self._fn(*args)


@dataclasses.dataclass
class Figures:
  """The chip's figures of a run; `rates` turns a speed into them.

  Attributes:
    device_kind: jax.devices()[0].device_kind.
    num_devices: devices of the whole job.
    flops_per_device: () -> FLOPs one device runs per step, or None while
      unknown (before the first step, or where the backend gives none).
    tokens_per_example: the workload's sequence length, or None.
    global_batch_size: examples per step.
    workload_flops_per_example: the workload's own FLOPs per example
      (forward and backward), which wins over the cost analysis.
    peak_tflops: a measured ceiling (config.peak_tflops) that MFU is taken
      against instead of the kind's datasheet figure; None for that.
  """
  device_kind: str
  num_devices: int
  flops_per_device: Callable[[], Optional[float]]
  global_batch_size: int = 0
  tokens_per_example: Optional[int] = None
  workload_flops_per_example: Optional[float] = None
  peak_tflops: Optional[float] = None
  timed_steps: int = 0
  timed_s: float = 0.0

  def count(self, steps: int, seconds: float) -> None:
    """Adds a window of timed steps (the first step of a run, which
    compiles, is in none) to the run's mean speed."""
    self.timed_steps += steps
    self.timed_s += seconds

  def mean_steps_per_sec(self) -> Optional[float]:
    return self.timed_steps / self.timed_s if self.timed_s > 0 else None

  @property
  def peak(self) -> Optional[float]:
    found = peak_of(self.device_kind, self.peak_tflops)
    return found.flops if found else None

  def step_flops(self) -> Optional[float]:
    """FLOPs of one step on one device, or None."""
    if self.workload_flops_per_example:
      return (self.workload_flops_per_example * self.global_batch_size /
              self.num_devices)
    return self.flops_per_device()

  @property
  def source(self) -> str:
    return ('the workload\'s flops_per_example'
            if self.workload_flops_per_example else
            'XLA\'s cost analysis of the compiled step')

  def rates(self, steps_per_sec: float) -> dict[str, float]:
    """tflops_per_device, mfu (where the peak is known) and tokens_per_sec
    (where the examples are sequences) at `steps_per_sec`."""
    out = {}
    flops = self.step_flops()
    if flops:
      per_device = flops * steps_per_sec
      out['tflops_per_device'] = per_device / 1e12
      if self.peak:
        out['mfu'] = per_device / self.peak
    if self.tokens_per_example:
      out['tokens_per_sec'] = (self.tokens_per_example *
                               self.global_batch_size * steps_per_sec)
    return out

  def describe(self) -> str:
    """One line: the FLOPs per step, where from, and the peak."""
    flops = self.step_flops()
    said = (f'{flops / 1e9:.4g} GFLOP per step per device ({self.source})'
            if flops else 'FLOPs per step unknown (no cost analysis on this '
            'backend; Task.flops_per_example gives them)')
    found = peak_of(self.device_kind, self.peak_tflops)
    if found:
      return (f'{said}; MFU against a peak of {found.flops / 1e12:g} TFLOP/s '
              f'per device ({found.what})')
    return (f'{said}; the peak of {self.device_kind!r} is unknown, so no '
            'MFU (runtime/flops.py lists the known kinds; '
            'config.peak_tflops gives a measured one)')

  def summary(self, steps_per_sec: Optional[float]) -> dict[str, Any]:
    """For summary.json: the kind, the peak, FLOPs per step and the run's
    rates."""
    out = {
        'device_kind': self.device_kind,
        'peak_tflops_per_device': self.peak / 1e12 if self.peak else None,
        'flops_per_step_per_device': self.step_flops(),
        'flops_source': self.source
    }
    if steps_per_sec:
      out.update(self.rates(steps_per_sec))
    return out
