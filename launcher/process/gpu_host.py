"""What a process on an NVIDIA GPU host sets before JAX starts its backend:
the GPUs it drives, the share of each it preallocates, and the field's
preset; said on one line and kept for run.json and the agreement check.

- GPUs: launcher/common/gpus.py finds them (nvidia-smi, the driver's
  directory, CUDA_VISIBLE_DEVICES), and `local_device_ids` goes to
  jax.distributed.initialize, so JAX's own guess (SLURM_LOCALID as an
  ordinal) never decides.
- Memory: JAX preallocates 75 % of each GPU unless told; --gpu_memory_fraction
  tells it, under XLA_CLIENT_MEM_FRACTION (what every JAX podrun supports
  reads; its old name XLA_PYTHON_CLIENT_MEM_FRACTION set beside it makes
  JAX raise, so the old one is moved over). Before the backend starts the
  process waits, bounded, for that share to be free: a killed process's
  memory can come back after its restart began.
- Preset (on by default, --gpu_preset=false drops it): XLA's latency-hiding
  scheduler (`--xla_gpu_enable_latency_hiding_scheduler=true`, NVIDIA's
  JAX image sets it; XLA's default is off) and, on Hopper,
  CUDA_DEVICE_MAX_CONNECTIONS=1. A flag or variable the user set wins.

Example:
  >>> setup = prepare(GpuPolicy(memory_fraction=0.9))
  >>> setup.line
  'GPU host: GPU 0 (GPU-1a2b...); local_device_ids [0]; preallocates 90% ...'
"""

import dataclasses
import os
import time
from typing import Any, Callable, Mapping, MutableMapping, Optional, Sequence

from launcher.common import gpus as gpus_lib

FRACTION = 'XLA_CLIENT_MEM_FRACTION'
OLD_FRACTION = 'XLA_PYTHON_CLIENT_MEM_FRACTION'
JAX_DEFAULT_FRACTION = 0.75
PRESET_XLA_FLAGS = ('--xla_gpu_enable_latency_hiding_scheduler=true',)
HOPPER_VARIABLES = (('CUDA_DEVICE_MAX_CONNECTIONS', '1'),)
_MEMORY_QUERY = ('nvidia-smi', '--query-gpu=index,memory.used,memory.total',
                 '--format=csv,noheader,nounits')

GpuPolicy = gpus_lib.GpuPolicy


@dataclasses.dataclass(frozen=True)
class GpuSetup:
  """What a GPU process was set up with.

  Attributes:
    gpus: the GPUs it drives.
    local_device_ids: their CUDA ordinals, for jax.distributed.initialize.
    fraction: the share of each it preallocates.
    variables: what was set in its environment (the preset's and the
      memory's), for run.json and the agreement check.
    waited_s: seconds waited for the memory to be free.
    line: the one line that says it all.
  """
  gpus: tuple[gpus_lib.Gpu, ...]
  local_device_ids: Optional[list[int]]
  fraction: float
  variables: dict[str, str]
  waited_s: float = 0.0
  line: str = ''

  def as_dict(self) -> dict[str, Any]:
    return {
        'gpus': [dataclasses.asdict(g) for g in self.gpus],
        'local_device_ids': self.local_device_ids,
        'memory_fraction': self.fraction,
        'variables': dict(self.variables),
    }


def _with_preset(env: Mapping[str, str], hopper: bool) -> dict[str, str]:
  """The preset's variables, leaving out what the user set."""
  out = {}
  flags = env.get('XLA_FLAGS', '')
  wanted = [f for f in PRESET_XLA_FLAGS if f.split('=')[0] not in flags]
  if wanted:
    out['XLA_FLAGS'] = ' '.join([flags.strip(), *wanted]).strip()
  if hopper:
    out.update({k: v for k, v in HOPPER_VARIABLES if k not in env})
  return out


def _fraction_variables(env: MutableMapping[str, str],
                        fraction: Optional[float]) -> tuple[float, dict]:
  """(the share JAX will preallocate, what to set for it)."""
  if fraction is not None:
    env.pop(OLD_FRACTION, None)
    return fraction, {FRACTION: f'{fraction:g}'}
  told = env.get(FRACTION) or env.get(OLD_FRACTION)
  if env.get(OLD_FRACTION) and not env.get(FRACTION):
    # The old name alone: moved to the new one, which JAX reads first.
    env.pop(OLD_FRACTION)
    return float(told or JAX_DEFAULT_FRACTION), {FRACTION: str(told)}
  return float(told) if told else JAX_DEFAULT_FRACTION, {}


def wait_for_memory(gpus: Sequence[gpus_lib.Gpu],
                    fraction: float,
                    timeout_s: float,
                    run: Callable[[Sequence[str]], Optional[str]],
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> float:
  """Waits until each of `gpus` has `fraction` of its memory free, at most
  `timeout_s`; returns the seconds waited (0 where nvidia-smi says
  nothing)."""
  started = clock()
  wanted = {g.index for g in gpus}
  while True:
    busy = []
    for line in (run(_MEMORY_QUERY) or '').splitlines():
      parts = [p.strip() for p in line.split(',')]
      if len(parts) == 3 and all(p.isdigit() for p in parts):
        index, used, total = map(int, parts)
        if index in wanted and total - used < fraction * total:
          busy.append(index)
    if not busy or clock() - started >= timeout_s:
      return clock() - started
    sleep(0.5)


def prepare(
    policy: GpuPolicy,
    env: MutableMapping[str, str] = os.environ,
    run: Callable[[Sequence[str]], Optional[str]] = (gpus_lib._nvidia_smi),  # pylint: disable=protected-access
    proc_root: str = gpus_lib._PROC_GPUS,  # pylint: disable=protected-access
    sleep: Callable[[float], None] = time.sleep
) -> Optional[GpuSetup]:
  """Sets this process's GPU variables in `env`; None where it has no GPU
  (or runs on emulated CPU devices, which the caller decides)."""
  found = gpus_lib.find(env, run, proc_root)
  if not found:
    return None
  fraction, variables = _fraction_variables(env, policy.memory_fraction)
  if policy.preset:
    variables.update(_with_preset(env, gpus_lib.is_hopper(found)))
  env.update(variables)
  ids = gpus_lib.local_device_ids(env)
  waited = wait_for_memory(found, fraction, policy.memory_wait_s, run, sleep)
  told = ', '.join(g.describe() for g in found)
  preset = (
      'preset ' +
      ', '.join(f'{k}={v}' for k, v in variables.items() if k != FRACTION) +
      ' (--gpu_preset=false '
      'drops it)') if policy.preset else 'no preset (--gpu_preset=false)'
  memory = (f'preallocates {fraction:.0%} of each ({FRACTION}; '
            '--gpu_memory_fraction sets it)')
  if waited >= policy.memory_wait_s:
    memory += (f'; waited {waited:.0f} s for that much to be free, and '
               'it still is not: another process holds it')
  elif waited > 1:
    memory += f'; waited {waited:.1f} s for it to be free'
  line = (f'GPU host: this process drives {told}; local_device_ids {ids}; '
          f'{memory}; {preset}')
  return GpuSetup(tuple(found), ids, fraction, variables, waited, line)


# This process's setup, once `prepare` has run: run.json keeps it.
_current: Optional[GpuSetup] = None


def remember(setup: Optional[GpuSetup]) -> None:
  global _current
  _current = setup


def current() -> Optional[GpuSetup]:
  """This process's GPU setup, or None (no GPU, or not set up yet)."""
  return _current
