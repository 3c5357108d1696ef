"""What each call of the step trains on: this process's rows of a call's
steps, read from the task's data (or gathered on the devices) in the order
of runtime/data.py, padded where the batch layout pads.

Example:
  >>> load = make(options.data, task, topo, par, layout)
  >>> batch = load(step=100, steps=4)   # steps 101-104, on the devices
"""

import functools
from typing import Any, Callable, Optional

import numpy as np

from runtime import data as data_lib
from runtime import device_data
from runtime import dispatch
from runtime import options as options_lib
from runtime.parallelism import microbatches
from runtime import task as task_lib


def make(data: options_lib.Data,
         task: task_lib.Task,
         topo,
         par,
         batch_layout: microbatches.Layout,
         readers: Optional[Any] = None) -> Callable[[int, int], Any]:
  """(step, steps) -> this process's part of the batches of the steps after
  `step`, on its devices, for one call (runtime/dispatch.py `stack`): its
  real examples of each step, then zero rows where the batch layout pads;
  read by `readers` where given (config.data.workers)."""
  rows, real = microbatches.process_positions(batch_layout, topo.process_index,
                                              topo.local_device_count)
  devices = topo.local_device_count

  def ids_of(step: int, steps: int) -> np.ndarray:
    """(steps, real) ids: this process's real examples of each step."""
    return data_lib.steps_batch_ids(step, steps, data.global_batch_size,
                                    len(task.data), data.seed,
                                    data.shuffle)[:,
                                                  rows.start:rows.start + real]

  if data.on_device:
    gather = device_data.Gather(par, task.data)

    def on_device(step: int, steps: int):
      # The host path's order, padding rows included (ids past the end).
      ids = np.full((steps, rows.stop - rows.start), gather.padding_id)
      ids[:, :real] = ids_of(step, steps)
      return gather(ids.reshape(steps, devices, -1).swapaxes(0, 1).reshape(-1))

    return on_device

  read = readers.read if readers is not None else functools.partial(
      data_lib.read_batch, task.data)

  def load(step: int, steps: int):
    ids = ids_of(step, steps)
    if real == rows.stop - rows.start and real % devices == 0:
      # No padding: one read of every step's examples, already in the
      # order `stack` would give (device by device, each device's rows step
      # by step), so the host copies the call's batch once, not twice.
      order = ids.reshape(steps, devices, -1).swapaxes(0, 1).reshape(-1)
      return par.put_batch(read(order))
    return par.put_batch(
        dispatch.stack(
            [data_lib.padded(read(one), rows.stop - rows.start) for one in ids],
            devices))

  return load
