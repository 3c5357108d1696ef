"""Which devices this process will see, settled before JAX starts its backend."""

import os
from typing import Optional

# Without an accelerator and without instructions, a single process emulates
# this many CPU devices, so that data parallelism is exercised on a laptop.
DEFAULT_CPU_DEVICES = 8


def configure(local_devices: Optional[int], multi_process: bool) -> None:
  """Sets JAX's device options for this process.

  Args:
    local_devices: --local_devices: run on this many emulated CPU devices,
      whatever accelerators the machine has. None keeps the platform JAX
      picks; a single process then gets DEFAULT_CPU_DEVICES CPU devices in
      case it ends up on the CPU, unless XLA_FLAGS already sets a count.
    multi_process: whether this process is one of several; CPU collectives
      across processes then go through gloo.

  Example:
    >>> configure(local_devices=4, multi_process=True)
  """
  import jax  # pylint: disable=g-import-not-at-top
  if local_devices is not None:
    if local_devices < 1:
      raise ValueError(f'--local_devices={local_devices}; it must be >= 1')
    jax.config.update('jax_platforms', 'cpu')
    jax.config.update('jax_num_cpu_devices', local_devices)
  elif (not multi_process and
        'xla_force_host_platform_device_count' not in os.environ.get(
            'XLA_FLAGS', '') and
        jax.config.jax_num_cpu_devices < 0):  # type: ignore[attr-defined]
    # Only the CPU backend reads this; a GPU or TPU stays the default.
    jax.config.update('jax_num_cpu_devices', DEFAULT_CPU_DEVICES)
  if multi_process:
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
