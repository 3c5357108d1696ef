"""How the job's devices share the work: one axis, two ways to run, batches.

Every device of every process sits on one axis, `DATA_AXIS` ('devices'),
over which the step's `lax.pmean` runs. The parts:

- `mapping`: the axis, the global mesh, and `Parallelism`, chosen once from
  `config.parallelism`: `PMAP` or `SHARD_MAP` (jit of shard_map), each with
  `map`, `put_batch`, `replicate` and `to_host`;
- `batches`: a global batch cut into each process's contiguous rows, then
  split over the process's devices, with errors that name every size;
- `microbatches`: the layout of a step's examples on any number of devices:
  groups of m examples, k of them a device one after another, padding
  groups where G does not divide (`train` uses it; `runtime/step.py`
  averages over the real groups);
- `device_axis`: `device_map`, a pmap that explains an argument whose leading
  dim is not one entry per local device.

Example:
  >>> par = parallelism.from_config(config)
  >>> step = par.map(step_fn, in_axes=(None, 0), out_axes=(None, None))
  >>> rows = batch[parallelism.process_rows(256, jax.process_index(),
  ...                                        jax.process_count())]
  >>> state, metrics = step(par.replicate(state), par.put_batch(rows))
"""

from runtime.parallelism.batches import BatchSizeError
from runtime.parallelism.batches import merge_devices
from runtime.parallelism.batches import per_device_batch_size
from runtime.parallelism.batches import process_rows
from runtime.parallelism.batches import process_slice
from runtime.parallelism.batches import split_for_devices
from runtime.parallelism.device_axis import check_device_axis
from runtime.parallelism.device_axis import device_map
from runtime.parallelism.device_axis import DeviceAxisError
from runtime.parallelism.mapping import CHOICES
from runtime.parallelism.mapping import DATA_AXIS
from runtime.parallelism.mapping import from_config
from runtime.parallelism.mapping import from_placement
from runtime.parallelism.mapping import global_mesh
from runtime.parallelism.mapping import named
from runtime.parallelism.mapping import of
from runtime.parallelism.mapping import Parallelism
from runtime.parallelism.mapping import PMAP
from runtime.parallelism.mapping import SHARD_MAP

__all__ = [
    'BatchSizeError',
    'CHOICES',
    'DATA_AXIS',
    'DeviceAxisError',
    'Parallelism',
    'PMAP',
    'SHARD_MAP',
    'check_device_axis',
    'device_map',
    'from_config',
    'from_placement',
    'global_mesh',
    'merge_devices',
    'named',
    'of',
    'per_device_batch_size',
    'process_rows',
    'process_slice',
    'split_for_devices',
]
