"""The pod a job expects, the pod JAX reports, and the check between them.

A topology is described by five factors: how many processes joined, which
one this is, how many devices each process drives, on which platform, and
across how many slices (a multislice TPU job; 1 elsewhere). A job
states what it expects in `config.topology` (and the launcher adds what its
flags imply); `check` compares that with `current()` and names every factor
that disagrees in one error, so a user fixes all of them in one go.
"""

import dataclasses
import os
from typing import Any, Mapping, Optional, Sequence

import jax

from runtime.common import accelerators
from runtime.common import handoff
from runtime.common import exit_codes


class TopologyMismatchError(exit_codes.PodrunError, RuntimeError):
  """The running pod is not the pod the config or the flags describe."""
  exit_code = exit_codes.TOPOLOGY_MISMATCH


@dataclasses.dataclass(frozen=True)
class Topology:
  """What JAX reports about the running job, from the view of one process."""
  process_index: int
  process_count: int
  local_device_count: int
  global_device_count: int
  platform: str
  device_kind: str
  num_slices: int = 1

  def describe(self) -> str:
    slices = (f', across {self.num_slices} slices'
              if self.num_slices > 1 else '')
    return (f'process {self.process_index} of {self.process_count}, '
            f'{self.local_device_count} local x {self.process_count} processes'
            f' = {self.global_device_count} {self.platform} devices '
            f'({self.device_kind}){slices}')

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Expectation:
  """One factor the job insists on, and where the insistence comes from.

  Attributes:
    factor: one of 'num_processes', 'process_index', 'local_devices',
      'platform', 'num_slices'.
    value: the expected value.
    source: what set it, as the user would write it, for example
      'config.topology.num_processes' or '--local_processes'.
  """
  factor: str
  value: Any
  source: str


_ACTUAL = {
    'num_processes': lambda t: t.process_count,
    'process_index': lambda t: t.process_index,
    'local_devices': lambda t: t.local_device_count,
    'platform': lambda t: t.platform,
    'num_slices': lambda t: t.num_slices,
}

_WHAT = {
    'num_processes': 'processes joined the job',
    'process_index': 'is this process\'s index',
    'local_devices': 'devices are attached to this process',
    'platform': 'is the platform JAX runs on',
    'num_slices': 'slice(s) form the job',
}


def current() -> Topology:
  """Reads the topology of the running job from JAX.

  Example:
    >>> topology.current().global_device_count
    8
  """
  local = jax.local_devices()
  # A TPU device names its slice; elsewhere (CPU emulation) the driver's
  # MEGASCALE_NUM_SLICES is all there is to read.
  slices = ({getattr(d, 'slice_index', None) for d in jax.devices()} -
            {None} if local[0].platform == 'tpu' else set())
  return Topology(
      process_index=jax.process_index(),
      process_count=jax.process_count(),
      local_device_count=len(local),
      global_device_count=jax.device_count(),
      platform=local[0].platform,
      device_kind=local[0].device_kind,
      num_slices=len(slices) if slices else num_slices_from_env(),
  )


def num_slices_from_env() -> int:
  """MEGASCALE_NUM_SLICES, which the TPU pod driver sets; 1 without it."""
  value = os.environ.get('MEGASCALE_NUM_SLICES', '')
  return int(value) if value.isdigit() and int(value) > 0 else 1


def expectations(config_topology: Any,
                 implied: Sequence[Expectation] = (),
                 **flag_values: Any) -> list[Expectation]:
  """Collects what the config and the launcher's flags expect of the pod.

  Args:
    config_topology: `config.topology`, with optional fields num_processes,
      local_devices, platform and num_slices; None means "whatever is
      there".
    implied: expectations the launcher derived, for example from
      config.topology.accelerator_type.
    **flag_values: factor=(value, flag_name) pairs from the launcher, for
      example num_processes=(2, '--local_processes'); None values are skipped.

  Returns:
    The expectations, config first.

  Raises:
    TopologyMismatchError: when the config and a flag already disagree.
  """
  found = []
  for factor in ('num_processes', 'local_devices', 'platform', 'num_slices'):
    value = config_topology.get(factor) if config_topology is not None else None
    if factor == 'platform':
      value = platform_of(value)
    if value is not None:
      found.append(Expectation(factor, value, f'config.topology.{factor}'))
  found.extend(implied)
  for factor, (value, flag) in flag_values.items():
    if factor not in _ACTUAL:
      raise ValueError(f'unknown topology factor {factor!r}')
    if value is not None:
      found.append(Expectation(factor, value, flag))
  conflicts = [
      f'{a.source}={a.value} but {b.source}={b.value}'
      for i, a in enumerate(found)
      for b in found[i + 1:]
      if a.factor == b.factor and a.value != b.value
  ]
  if conflicts:
    raise TopologyMismatchError(
        'the config and the launcher flags describe different pods: ' +
        '; '.join(conflicts) + '. Make them agree, or leave the config field '
        'None to accept whatever the launcher starts.')
  return found


def check(expected: Sequence[Expectation], actual: Topology) -> None:
  """Stops the job when the running pod differs from the expected one.

  Every disagreeing factor is named, with the expected value, its source and
  what JAX reports. Uneven pods (processes with different device counts) are
  refused too, since the runtime splits every batch evenly.

  Args:
    expected: from `expectations`.
    actual: from `current()`.

  Raises:
    TopologyMismatchError: listing every factor that disagrees.
  """
  problems = []
  for e in expected:
    got = _ACTUAL[e.factor](actual)
    if got != e.value:
      problems.append(f'{e.factor}: {e.source} expects {e.value}, but {got} '
                      f'{_WHAT[e.factor]}')
  if actual.global_device_count != (actual.process_count *
                                    actual.local_device_count):
    problems.append(
        f'uneven pod: {actual.global_device_count} devices in all, but '
        f'{actual.process_count} processes x {actual.local_device_count} '
        f'local devices = {actual.process_count * actual.local_device_count};'
        ' every process must drive the same number of devices')
  if problems:
    raise TopologyMismatchError(
        f'topology mismatch ({len(problems)} '
        f'factor{"s" if len(problems) > 1 else ""}):\n  - ' +
        '\n  - '.join(problems) +
        f'\nRunning pod: {actual.describe()}.\nChange config.topology or the '
        'launch (--local_processes, --local_devices, --num_processes, the '
        'cluster allocation) so that they agree.')


def platform_of(name: Optional[str]) -> Optional[str]:
  """Normalises a platform name as JAX spells it ('GPU' and 'cuda' -> 'gpu')."""
  if name is None:
    return None
  name = name.lower()
  return 'gpu' if name in ('cuda', 'rocm') else name


def implied_by_accelerator(
    section: Optional[Mapping[str, Any]]) -> list[Expectation]:
  """What config.topology.accelerator_type says of the pod, if it is set.

  Args:
    section: config.topology (as `expectations` takes it), or None.
  """
  section = section or {}
  name = section.get('accelerator_type')
  if not name:
    return []
  try:
    slice_ = accelerators.slice_topology(name)
  except accelerators.AcceleratorTypeError as e:
    raise exit_codes.ConfigError(f'config.topology.accelerator_type: {e}')
  source = f'config.topology.accelerator_type={name}'
  slices = section.get('num_slices')
  if slices:
    source += f' x config.topology.num_slices={slices}'
  else:
    slices = num_slices_from_env()
    if slices > 1:
      source += f' x MEGASCALE_NUM_SLICES={slices}'
  return [
      Expectation('platform', 'tpu', source),
      Expectation('num_processes', slice_.hosts * slices, source),
      Expectation('local_devices', slice_.devices_per_host, source)
  ]


def implied_by_pod_launch() -> list[Expectation]:
  """The worker count scripts/launch_tpu_pod.sh read from the pod, if any.

  A worker whose JAX does not find the pod (no libtpu, say) would otherwise
  run a job of its own, "process 0 of 1", beside the others.
  """
  count = handoff.current().expected_processes
  if not count:
    return []
  slices = num_slices_from_env()
  what = (f'{slices} slices x {int(count) // slices} workers'
          if slices > 1 else f'{count} workers')
  variable = handoff.variable('expected_processes')
  source = (f'the TPU pod\'s {what} ({variable}, from '
            'scripts/launch_tpu_pod.sh)')
  expected = [Expectation('num_processes', int(count), source)]
  if slices > 1:
    expected.append(
        Expectation(
            'num_slices', slices, 'MEGASCALE_NUM_SLICES, from '
            'scripts/launch_tpu_pod.sh --num_slices'))
  return expected
