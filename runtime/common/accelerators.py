"""Cloud TPU accelerator types and the pod topology each one implies.

An accelerator type names a generation and a size, e.g. 'v4-32'. For v2, v3,
v4 and v5p the size counts TensorCores (two per chip); for v5e
('v5litepod-N') and v6e it counts chips (one TensorCore each). JAX shows one
device per TensorCore on v2 and v3, and one per chip from v4 on (the two
TensorCores of a v4 or v5p chip act as one "megacore" device).

Per host: v2 and v3 hosts hold 4 chips (8 devices); v4 and v5p hosts 4 chips;
v5e and v6e slices of up to 8 chips are one host with all of them, larger
slices are made of 4-chip hosts.
"""

import dataclasses
import re

from runtime.common import exit_codes


class AcceleratorTypeError(exit_codes.ConfigError):
  """An accelerator type that is not in the table."""


@dataclasses.dataclass(frozen=True)
class Generation:
  name: str
  sizes: tuple[int, ...]  # Valid values of N in '<prefix>-N'.
  size_counts: str  # 'cores' or 'chips'.
  devices_per_chip: int  # JAX devices per chip.
  chips_per_host: int  # In multi-host slices.
  single_host_max_chips: int  # Slices up to this many chips are one host.


GENERATIONS = {
    'v2':
        Generation('v2', (8, 32, 128, 256, 512), 'cores', 2, 4, 4),
    'v3':
        Generation('v3', (8, 32, 64, 128, 256, 512, 1024, 2048), 'cores', 2, 4,
                   4),
    'v4':
        Generation('v4', tuple(range(8, 4097, 8)), 'cores', 1, 4, 4),
    'v5p':
        Generation('v5p', tuple(range(8, 12289, 8)), 'cores', 1, 4, 4),
    'v5litepod':
        Generation('v5litepod', (1, 4, 8, 16, 32, 64, 128, 256), 'chips', 1, 4,
                   8),
    'v6e':
        Generation('v6e', (1, 4, 8, 16, 32, 64, 128, 256), 'chips', 1, 4, 8),
}
# Other spellings of the same generations.
_ALIASES = {'v5e': 'v5litepod', 'v5lite': 'v5litepod'}


@dataclasses.dataclass(frozen=True)
class SliceTopology:
  """What a slice of one accelerator type looks like to JAX.

  Attributes:
    accelerator_type: as given, e.g. 'v4-32'.
    chips: TPU chips in the slice.
    hosts: TPU VMs (workers), one JAX process each.
    chips_per_host: chips on each host.
    devices_per_host: JAX devices per process (jax.local_device_count()).
  """
  accelerator_type: str
  chips: int
  hosts: int
  chips_per_host: int
  devices_per_host: int

  @property
  def devices(self) -> int:
    return self.hosts * self.devices_per_host

  def describe(self) -> str:
    return (f'{self.accelerator_type}: {self.hosts} host(s) x '
            f'{self.chips_per_host} chip(s), {self.devices_per_host} JAX '
            f'device(s) per host, {self.devices} in all')


def slice_topology(accelerator_type: str) -> SliceTopology:
  """Hosts, chips and JAX devices of a Cloud TPU accelerator type.

  Args:
    accelerator_type: e.g. 'v3-32', 'v4-16', 'v5litepod-16', 'v5p-8',
      'v6e-64' (case does not matter).

  Raises:
    AcceleratorTypeError: naming the generations, or the sizes of the
      generation, that exist.

  Example:
    >>> slice_topology('v4-32')
    SliceTopology(accelerator_type='v4-32', chips=16, hosts=4,
                  chips_per_host=4, devices_per_host=4)
  """
  match = re.fullmatch(r'([a-z0-9]+)-(\d+)', accelerator_type.strip().lower())
  if not match:
    raise AcceleratorTypeError(
        f'accelerator type {accelerator_type!r} is not GENERATION-SIZE, such '
        'as v4-32 or v5litepod-16')
  prefix, size = _ALIASES.get(match[1], match[1]), int(match[2])
  generation = GENERATIONS.get(prefix)
  if generation is None:
    raise AcceleratorTypeError(
        f'accelerator type {accelerator_type!r}: unknown generation '
        f'{match[1]!r}; known: {", ".join(GENERATIONS)}')
  if size not in generation.sizes:
    shown = (f'multiples of 8 from 8 to {generation.sizes[-1]}' if len(
        generation.sizes) > 12 else ', '.join(str(s) for s in generation.sizes))
    raise AcceleratorTypeError(
        f'accelerator type {accelerator_type!r}: {generation.name} slices '
        f'have {shown} {generation.size_counts}, not {size}')
  chips = size // 2 if generation.size_counts == 'cores' else size
  if chips <= generation.single_host_max_chips:
    hosts, per_host = 1, chips
  else:
    hosts, per_host = chips // generation.chips_per_host, (
        generation.chips_per_host)
  return SliceTopology(accelerator_type, chips, hosts, per_host,
                       per_host * generation.devices_per_chip)
