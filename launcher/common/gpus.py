"""The NVIDIA GPUs of this host and which of them each process drives, found
without starting CUDA: the launcher and the data workers never initialise
it, so a GPU's memory belongs to the process that trains on it.

Where they come from, in order: `nvidia-smi --query-gpu` (index, UUID, PCI
bus id and name), else `/proc/driver/nvidia/gpus/<bus id>`; either narrowed
to `CUDA_VISIBLE_DEVICES` where it is set. A scheduler that sets
`CUDA_VISIBLE_DEVICES` for a task (SLURM, Ray) has CUDA number the listed
GPUs from 0, which is what `local_device_ids` must then name (JAX issues
16788 and 23452: SLURM_LOCALID as an ordinal fails on a partial node).

Example:
  >>> found = find()                      # 8 GPUs on this host
  >>> [p.describe() for p in split(found, 2)]
  ['GPU 0-3 (GPU-1a.., GPU-2b.., ...)', 'GPU 4-7 (...)']
"""

import dataclasses
import os
import re
import subprocess
from typing import Callable, Mapping, Optional, Sequence

from launcher.common import flag_spec
from runtime.common import exit_codes

_PROC_GPUS = '/proc/driver/nvidia/gpus'
# A PCI bus id as the driver names each GPU's directory: 0000:3b:00.0.
_BUS_ID = re.compile(r'[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d')
_QUERY = ('nvidia-smi', '--query-gpu=index,uuid,pci.bus_id,name',
          '--format=csv,noheader')


class GpuLayoutError(exit_codes.ConfigError, ValueError):
  """A layout that would put two processes on one GPU, or leave some idle
  unevenly (exit 2)."""


@dataclasses.dataclass(frozen=True)
class GpuPolicy:
  """The launcher's GPU flags, read once.

  Attributes:
    memory_fraction: the share of each GPU JAX preallocates
      (--gpu_memory_fraction); None: JAX's own (0.75, or what the
      environment already says).
    preset: set the field's preset (--gpu_preset).
    memory_wait_s: the most seconds to wait for that share to be free.
  """
  memory_fraction: Optional[float] = flag_spec.flag(
      None,
      flag_spec.WHAT,
      'GPU: the share of each GPU a process preallocates',
      'On a GPU host: the share of each GPU a process preallocates, set as '
      'XLA_CLIENT_MEM_FRACTION. Default: JAX\'s own (0.75), or what the '
      'environment says.',
      name='gpu_memory_fraction')
  preset: bool = flag_spec.flag(
      True,
      flag_spec.WHAT,
      "GPU: the field's XLA preset (on by default)",
      'On a GPU host: set the field\'s preset, XLA\'s latency-hiding '
      'scheduler and on Hopper CUDA_DEVICE_MAX_CONNECTIONS=1; a flag or '
      'variable already set wins.',
      name='gpu_preset')
  memory_wait_s: float = 30.0

  def __post_init__(self):
    if self.memory_fraction is not None and not 0 < self.memory_fraction <= 1:
      raise ValueError(f'--gpu_memory_fraction={self.memory_fraction}; it '
                       'must be in (0, 1]')


@dataclasses.dataclass(frozen=True)
class Gpu:
  """One GPU as the driver lists it.

  Attributes:
    index: its index in the driver's (and CUDA's) order on this host.
    uuid: 'GPU-...', or '' where unknown.
    bus_id: its PCI bus id, or ''.
    name: the product name ('NVIDIA H200'), or ''.
    token: what names it in CUDA_VISIBLE_DEVICES as the parent's variable
      did (an index, or a UUID).
  """
  index: int
  uuid: str = ''
  bus_id: str = ''
  name: str = ''
  token: str = ''

  def describe(self) -> str:
    return f'GPU {self.index}' + (f' ({self.uuid or self.bus_id})'
                                  if self.uuid or self.bus_id else '')


def _query(run: Callable[[Sequence[str]], Optional[str]]) -> list[Gpu]:
  out = run(_QUERY)
  gpus = []
  for line in (out or '').splitlines():
    parts = [p.strip() for p in line.split(',')]
    if len(parts) >= 4 and parts[0].isdigit():
      index = int(parts[0])
      gpus.append(Gpu(index, parts[1], parts[2], parts[3], str(index)))
  return gpus


def _from_proc(root: str) -> list[Gpu]:
  try:
    bus_ids = sorted(n for n in os.listdir(root) if _BUS_ID.fullmatch(n))
  except OSError:
    return []
  return [Gpu(i, '', bus, '', str(i)) for i, bus in enumerate(bus_ids)]


def _nvidia_smi(command: Sequence[str]) -> Optional[str]:
  try:
    done = subprocess.run(command,
                          capture_output=True,
                          text=True,
                          timeout=20,
                          check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  return done.stdout if done.returncode == 0 else None


def _narrowed(gpus: list[Gpu], visible: str) -> list[Gpu]:
  """The GPUs CUDA_VISIBLE_DEVICES lets a process see, in its order, each
  named as the variable names it."""
  chosen = []
  for token in (t.strip() for t in visible.split(',')):
    if not token:
      continue
    match = [
        g for g in gpus if token == str(g.index) or
        (token.startswith('GPU-') and g.uuid.startswith(token))
    ]
    if match:
      chosen.append(dataclasses.replace(match[0], token=token))
    elif token.isdigit():
      chosen.append(Gpu(int(token), token=token))
    else:
      chosen.append(Gpu(len(chosen), uuid=token, token=token))
  return chosen


def find(env: Optional[Mapping[str, str]] = None,
         run: Callable[[Sequence[str]], Optional[str]] = _nvidia_smi,
         proc_root: str = _PROC_GPUS) -> list[Gpu]:
  """This host's GPUs that a process started here may use; [] for none.

  Args:
    env: the environment (os.environ by default); CUDA_VISIBLE_DEVICES
      narrows the list ('' or -1: none).
    run: runs a command and gives its output, or None where it fails.
    proc_root: the driver's directory of GPUs, read where nvidia-smi fails.
  """
  env = os.environ if env is None else env
  visible = env.get('CUDA_VISIBLE_DEVICES')
  if visible is not None and visible.strip() in ('', '-1'):
    return []
  gpus = _query(run) or _from_proc(proc_root)
  if visible is not None:
    return _narrowed(gpus, visible)
  return gpus


@dataclasses.dataclass(frozen=True)
class Share:
  """The GPUs one process drives."""
  gpus: tuple[Gpu, ...]

  @property
  def visible(self) -> str:
    """CUDA_VISIBLE_DEVICES for the process."""
    return ','.join(g.token or str(g.index) for g in self.gpus)

  def describe(self) -> str:
    return ', '.join(g.describe() for g in self.gpus)


def split(gpus: Sequence[Gpu], processes: int) -> list[Share]:
  """Each of `processes` processes its own GPUs, in order: len(gpus) /
  processes each.

  Raises:
    GpuLayoutError: where processes do not divide the GPUs, or outnumber
      them (one GPU is one NCCL rank's: two processes on it fail), naming
      the counts that work.
  """
  count = len(gpus)
  if processes >= 1 and count and count % processes == 0:
    each = count // processes
    return [
        Share(tuple(gpus[i * each:(i + 1) * each])) for i in range(processes)
    ]
  counts = [d for d in range(1, count + 1) if count % d == 0]
  why = ('more processes than GPUs would put two on one GPU, which NCCL '
         'refuses' if processes > count else
         f'{processes} process(es) do not divide {count} GPU(s) evenly')
  raise GpuLayoutError(
      f'--local_processes={processes} on a host of {count} GPU(s): {why}. '
      f'Use --local_processes={" or ".join(map(str, counts))} (each '
      'process drives its own GPUs), or --local_devices=K to run on '
      'emulated CPU devices instead.')


def is_hopper(gpus: Sequence[Gpu]) -> bool:
  """Whether these are Hopper GPUs (H100, H200, GH200), for the preset."""
  return bool(gpus) and all(
      any(part in g.name.upper()
          for part in ('H100', 'H200', 'GH200'))
      for g in gpus)


def local_device_ids(env: Mapping[str, str]) -> Optional[list[int]]:
  """The CUDA ordinals this process drives, for jax.distributed.initialize's
  `local_device_ids`; None to leave JAX's choice (no GPU variables).

  - CUDA_VISIBLE_DEVICES set (by podrun's local pod, SLURM with --gres or
    --gpus-per-task, Ray, a container runtime): every GPU it lists, which
    CUDA numbers from 0.
  - Else SLURM_STEP_GPUS (or SLURM_JOB_GPUS): the step's GPUs by their
    host ordinals, this task's share where several tasks of the step share
    the node (SLURM_LOCALID of SLURM_NTASKS_PER_NODE or the node's
    SLURM_TASKS_PER_NODE).

  Example:
    >>> local_device_ids({'CUDA_VISIBLE_DEVICES': '0,1,2,3'})
    [0, 1, 2, 3]
    >>> local_device_ids({'SLURM_STEP_GPUS': '2,3', 'SLURM_LOCALID': '1',
    ...                   'SLURM_NTASKS_PER_NODE': '2'})
    [3]
  """
  visible = env.get('CUDA_VISIBLE_DEVICES')
  if visible is not None:
    listed = [t for t in visible.split(',') if t.strip() and t.strip() != '-1']
    return list(range(len(listed))) or None
  step = env.get('SLURM_STEP_GPUS') or env.get('SLURM_JOB_GPUS')
  if not step:
    return None
  ordinals = [int(t) for t in step.split(',') if t.strip().isdigit()]
  tasks = _tasks_on_this_node(env)
  local = int(env.get('SLURM_LOCALID', '0') or 0)
  if tasks > 1 and len(ordinals) % tasks == 0:
    each = len(ordinals) // tasks
    return ordinals[local * each:(local + 1) * each]
  return ordinals


def _tasks_on_this_node(env: Mapping[str, str]) -> int:
  told = env.get('SLURM_NTASKS_PER_NODE')
  if told and told.isdigit():
    return int(told)
  # SLURM_TASKS_PER_NODE: '2(x3),1'; this node's is the first entry that
  # SLURM_NODEID falls in.
  spec = env.get('SLURM_TASKS_PER_NODE', '')
  node = int(env.get('SLURM_NODEID', '0') or 0)
  seen = 0
  for part in (p for p in spec.split(',') if p):
    count, _, times = part.partition('(x')
    repeat = int(times.rstrip(')')) if times else 1
    if node < seen + repeat and count.isdigit():
      return int(count)
    seen += repeat
  return 1
