"""A job's first group size, kept by its later attempts.

A job that loses processes trains the same global batch on fewer devices
(runtime/parallelism/microbatches.py). Left to choose, each device would
then take more examples in one pass than on the first attempt, and a model
that just fitted in a device's memory would run out of it; and a model with
statistics over a group (BatchNorm) would compute them over other groups.
So the first attempt's examples per pass (its group size m) are written to
WORKDIR/device_batch_limit.json, and a later attempt whose config fixes
none of device_batch_limit, microbatches and microbatch_size keeps m as its
group size: on fewer devices it accumulates microbatches, on any number of
devices the groups, and so the step, are the same. That costs no passes: on
D devices no group of at most m examples needs fewer than
ceil(G / m / D).

Example:
  >>> size = batch_limit.first_group_size(config, workdir, num_devices=6)
  >>> microbatches.plan(config.global_batch_size, 6, microbatch_size=size)
"""

import json
import os
from typing import Optional

from ml_collections import ConfigDict

from runtime import coordination
from runtime.common import files
from runtime.common import layout
from runtime.parallelism import microbatches

_KEY = 'podrun/device_batch_limit'


def _read(workdir: str) -> Optional[int]:
  try:
    with open(layout.Record(workdir).batch_limit()) as f:
      return int(json.load(f)['device_batch_limit'])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _first_or_new(workdir: str, global_batch_size: int,
                  num_devices: int) -> int:
  """The limit written by the job's first attempt, or this one's, written."""
  found = _read(workdir)
  if found is not None:
    return found
  plan = microbatches.plan(global_batch_size, num_devices)
  os.makedirs(workdir, exist_ok=True)
  files.write_json(layout.Record(workdir).batch_limit(), {
      'device_batch_limit': plan.microbatch_size,
      'num_devices': num_devices,
      'global_batch_size': global_batch_size})
  return plan.microbatch_size


def first_group_size(config: ConfigDict, workdir: str,
                     num_devices: int) -> Optional[int]:
  """The group size of this attempt, as the job's first attempt chose it.

  Args:
    config: the job's config; when it sets device_batch_limit, microbatches
      or microbatch_size, the user steers and nothing is remembered (None).
    workdir: where the first attempt's group size is kept.
    num_devices: every device of this attempt.

  Returns:
    The group size, the same on every process (process 0 reads or writes
    it), or None.
  """
  if any(config.get(f) for f in ('device_batch_limit', 'microbatches',
                                 'microbatch_size')):
    return None
  def make() -> str:
    return str(_first_or_new(workdir, config.global_batch_size, num_devices))
  client = coordination.current()
  if client is None or client.process_count == 1:
    return int(make())
  return int(client.from_0(_KEY, make))
