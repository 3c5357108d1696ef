"""--dry_run without a local pod: what this process would run.

Example:
  >>> print_plan(sys.argv, distributed.CoordinatorFlags(), local_devices=None)
  this process would run: python -m launcher --config=...
"""

import shlex
import sys
from typing import Optional

from absl import logging

from launcher.process import devices
from launcher.process import distributed
from runtime.common import exit_codes


def print_plan(argv: list[str], options: distributed.CoordinatorFlags,
               local_devices: Optional[int]) -> int:
  """--dry_run without a local pod: what this process would do."""
  try:
    chosen = distributed.plan(options)
  except distributed.DistributedInitError as e:
    logging.error('%s', e)
    return exit_codes.DISTRIBUTED_INIT_FAILED
  command = [sys.executable, '-m', 'launcher'] + [
      a for a in argv[1:] if a not in ('--dry_run', '--dry_run=true')
  ]
  print(f'this process would run: {shlex.join(command)}')
  mode = chosen.mode
  print(f'  jax.distributed: {_MODE_WORDS[mode]}; {chosen.why}')
  if local_devices is not None:
    print(f'  devices: {local_devices} emulated CPU devices '
          '(jax_platforms=cpu, jax_num_cpu_devices)')
  elif mode == distributed.SINGLE:
    print('  devices: the machine\'s accelerators, else '
          f'{devices.DEFAULT_CPU_DEVICES} emulated CPU devices')
  return exit_codes.OK


_MODE_WORDS = {
    distributed.SINGLE: 'not started (one process, no coordinator)',
    distributed.DETECT: 'initialised from the cluster JAX detects',
    distributed.EXPLICIT: 'initialised from --coordinator_address, '
                          '--num_processes and --process_id',
}
