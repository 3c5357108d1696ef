"""A job's first per-device batch, kept as the limit of its later attempts.

A job that loses processes trains the same global batch on fewer devices
(runtime/parallelism/microbatches.py). Without `config.device_batch_limit`
each device would then take more examples in one pass than on the first
attempt, and a model that just fitted in a device's memory would run out of
it. So the first attempt's examples per pass are written to
WORKDIR/device_batch_limit.json, and a later attempt that names no limit
takes them as its limit: it accumulates microbatches instead.

Example:
  >>> limit = batch_limit.device_batch_limit(config, workdir, num_devices=6)
  >>> microbatches.plan(config.global_batch_size, 6, limit)
"""

import json
import os
from typing import Optional

from ml_collections import ConfigDict

from runtime import coordination
from runtime.common import files
from runtime.parallelism import microbatches

FILE = 'device_batch_limit.json'
_KEY = 'podrun/device_batch_limit'


def _read(workdir: str) -> Optional[int]:
  try:
    with open(os.path.join(workdir, FILE)) as f:
      return int(json.load(f)['device_batch_limit'])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _first_or_new(workdir: str, global_batch_size: int,
                  num_devices: int) -> int:
  """The limit written by the job's first attempt, or this one's, written."""
  found = _read(workdir)
  if found is not None:
    return found
  layout = microbatches.plan(global_batch_size, num_devices)
  os.makedirs(workdir, exist_ok=True)
  files.write_json(os.path.join(workdir, FILE), {
      'device_batch_limit': layout.microbatch_size,
      'num_devices': num_devices,
      'global_batch_size': global_batch_size})
  return layout.microbatch_size


def device_batch_limit(config: ConfigDict, workdir: str,
                       num_devices: int) -> Optional[int]:
  """The most examples a device takes in one pass in this attempt.

  Args:
    config: the job's config; its device_batch_limit wins when set, and
      with config.microbatches set nothing is remembered (the user steers).
    workdir: where the first attempt's limit is kept.
    num_devices: every device of this attempt.

  Returns:
    The limit, the same on every process (process 0 reads or writes it),
    or None.
  """
  if config.get('device_batch_limit'):
    return config.device_batch_limit
  if config.get('microbatches'):
    return None
  def make() -> str:
    return str(_first_or_new(workdir, config.global_batch_size, num_devices))
  client = coordination.current()
  if client is None or client.process_count == 1:
    return int(make())
  return int(client.from_0(_KEY, make))
