"""What the compiled step needs of each device's memory, from XLA's memory
analysis, against what the device has.

Example:
  >>> need = memory.of_compiled(step.lower(state, batch).compile())
  >>> need.describe()
  'the step needs 1.21 GiB a device: arguments 1.02 GiB (0.98 GiB of them
  donated to the outputs), outputs 0.98 GiB, temporaries 0.19 GiB'
"""

import dataclasses
from typing import Any, Optional

import jax

_GIB = 1024**3


def _size(n: float) -> str:
  if n >= _GIB:
    return f'{n / _GIB:.2f} GiB'
  return f'{n / 1024 ** 2:.1f} MiB'


@dataclasses.dataclass(frozen=True)
class StepMemory:
  """Bytes one device holds while the step runs.

  Attributes:
    arguments: the state and the batch as the step gets them.
    outputs: the new state and the metrics.
    aliased: the outputs written into donated arguments' buffers.
    temporaries: everything else the step allocates (activations, gathered
      parameters, gradients).
    code: the compiled program.
  """
  arguments: int
  outputs: int
  aliased: int
  temporaries: int
  code: int = 0

  @property
  def total(self) -> int:
    """The peak, as XLA plans it: arguments, outputs not written into
    donated arguments, temporaries and the program."""
    return (self.arguments + self.outputs - self.aliased + self.temporaries +
            self.code)

  def describe(self) -> str:
    return (f'the step needs {_size(self.total)} a device: arguments '
            f'{_size(self.arguments)} ({_size(self.aliased)} of them donated '
            f'to the outputs), outputs {_size(self.outputs)}, temporaries '
            f'{_size(self.temporaries)}')

  def as_dict(self) -> dict[str, int]:
    return {**dataclasses.asdict(self), 'total': self.total}


def of_compiled(compiled: Any) -> Optional[StepMemory]:
  """The memory analysis of a compiled program; None where the backend
  gives none."""
  try:
    stats = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if stats is None:
    return None
  if isinstance(stats, (list, tuple)):  # Older JAX: one per program.
    stats = stats[0] if stats else None
    if stats is None:
      return None
  return StepMemory(arguments=int(stats.argument_size_in_bytes),
                    outputs=int(stats.output_size_in_bytes),
                    aliased=int(stats.alias_size_in_bytes),
                    temporaries=int(stats.temp_size_in_bytes),
                    code=int(
                        getattr(stats, 'generated_code_size_in_bytes', 0) or 0))


def device_limit() -> Optional[int]:
  """The bytes the first local device has for arrays, where it says (an
  accelerator); None on a CPU."""
  stats = jax.local_devices()[0].memory_stats()
  if not stats:
    return None
  return stats.get('bytes_limit')


def verdict(need: StepMemory, limit: Optional[int]) -> tuple[bool, str]:
  """(whether it fits, the line that says so) for a device of `limit`
  bytes (None: unknown)."""
  if limit is None:
    return True, need.describe() + '; the device does not say its memory'
  share = need.total / limit
  if share <= 1:
    return True, (f'{need.describe()}; {share:.0%} of the device\'s '
                  f'{_size(limit)}')
  return False, (
      f'{need.describe()}: over the device\'s {_size(limit)} by '
      f'{_size(need.total - limit)}. config.state_layout=\'sharded\' splits '
      'the parameters, gradients and optimiser state over a replica\'s '
      'devices; config.device_batch_limit (or microbatches) cuts the '
      'activations')
