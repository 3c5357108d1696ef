"""A job's first group size, kept by its later attempts.

A job that loses processes trains the same global batch on fewer devices
(runtime/parallelism/microbatches.py). Left to choose, each device would
then take more examples in one pass than on the first attempt, and a model
that just fitted in a device's memory would run out of it; and a model with
statistics over a group (BatchNorm) would compute them over other groups.
So the group size (m) of the job's first attempt that ran a step is written
to WORKDIR/device_batch_limit.json, with the global batch it was made for,
and a later attempt whose config fixes none of device_batch_limit,
microbatches and microbatch_size keeps m as its group size: on fewer devices
it accumulates microbatches, on any number of devices the groups, and so the
step, are the same. That costs no passes: on D devices no group of at most m
examples needs fewer than ceil(G / m / D).

Nothing is written before a step has run (`remember`, after the first call
retires): a run refused in its set-up leaves nothing that steers the next.
A file made for another global batch is ignored, and the layout line says
so (`first_group_size`'s note).

Example:
  >>> size, note = batch_limit.first_group_size(
  ...     options.data.global_batch_size, options.groups.steered(), record)
  >>> microbatches.plan(config.global_batch_size, 6, microbatch_size=size)
  >>> batch_limit.remember(options.groups.steered(), record, layout)  # run
"""

import json
import os
from typing import Optional

from runtime import coordination
from runtime.common import files
from runtime.common import layout
from runtime.parallelism import microbatches

_KEY = 'podrun/device_batch_limit'


def _read(record: layout.Record) -> Optional[dict]:
  try:
    with open(record.batch_limit()) as f:
      found = json.load(f)
    int(found['device_batch_limit'])
    return found
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _kept(record: layout.Record,
          global_batch_size: int) -> tuple[Optional[int], str]:
  """(the first attempt's group size or None, why: '' or the note)."""
  found = _read(record)
  if found is None:
    return None, ''
  made_for = found.get('global_batch_size')
  if made_for != global_batch_size:
    return None, (f'{layout.BATCH_LIMIT} (groups of '
                  f'{found["device_batch_limit"]}) was made for global batch '
                  f'{made_for}, not {global_batch_size}: ignored')
  return int(found['device_batch_limit']), (
      f'groups of {found["device_batch_limit"]} as the job\'s first attempt '
      f'on {found.get("num_devices")} device(s) ({layout.BATCH_LIMIT})')


def first_group_size(global_batch_size: int, steered: bool,
                     record: layout.Record) -> tuple[Optional[int], str]:
  """The group size the job's first attempt trained with, and a note for
  the layout line.

  Args:
    global_batch_size: this run's; a group size kept for another is
      ignored.
    steered: whether the config sets device_batch_limit, microbatches or
      microbatch_size (options.Groups.steered): then the user steers and
      nothing is remembered.
    record: where the first attempt's group size is kept.

  Returns:
    (the group size or None, the note: why it is used or ignored, '' when
    there is nothing to say), the same on every process (process 0 reads
    it).
  """
  if steered:
    return None, ''

  def read() -> str:
    return json.dumps(_kept(record, global_batch_size))

  client = coordination.current()
  if client is None or client.process_count == 1:
    size, note = json.loads(read())
  else:
    size, note = json.loads(client.from_0(_KEY, read))
  return size, note


def remember(steered: bool, record: layout.Record,
             chosen: microbatches.Layout) -> None:
  """Writes `chosen`'s group size as the job's first, on process 0, once a
  step has run with it; nothing when the config steers the groups or an
  earlier attempt's size for this global batch is already kept."""
  if steered or _kept(record, chosen.global_batch_size)[0]:
    return
  os.makedirs(record.workdir, exist_ok=True)
  files.write_json(
      record.batch_limit(), {
          'device_batch_limit': chosen.microbatch_size,
          'num_devices': chosen.num_devices,
          'global_batch_size': chosen.global_batch_size
      })
