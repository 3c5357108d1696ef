"""Who has come to join a job, while jax.distributed is still forming it.

Until every process has registered, JAX's coordination service answers no
questions, and when one process never comes JAX aborts every other one with
a message that names nobody (or only in its C++ log). So before joining,
each process signs a roll call: a small file in WORKDIR/.podrun/join. If the
job has not formed within --initialization_timeout, `Watch` names the
processes that never signed (or whose files this process cannot see when
the workdir is not shared) and ends the process with
exit_codes.DISTRIBUTED_INIT_FAILED, before JAX's own, later, abort.
"""

import json
import os
import socket
import sys
import threading
import time
from typing import NoReturn, Optional

from absl import logging

from runtime.common import exit_codes
from runtime.common import layout


class RollCall:
  """The roll call of one job in one directory.

  Example:
    >>> roll = RollCall('/runs/a', '10.0.0.2:8476', process_index=1,
    ...                 num_processes=4)
    >>> roll.sign()
    >>> roll.missing()
    [2, 3]
  """

  def __init__(self, record: layout.Record, coordinator_address: str,
               process_index: int, num_processes: int):
    self.directory = record.join()
    self.coordinator_address = coordinator_address
    self.process_index = process_index
    self.num_processes = num_processes
    self.signed_at = time.time()

  def _path(self, process_index: int) -> str:
    return layout.rank_file(self.directory, process_index)

  def sign(self) -> None:
    try:
      os.makedirs(self.directory, exist_ok=True)
      with open(self._path(self.process_index), 'w') as f:
        json.dump(
            {
                'host': socket.gethostname(),
                'pid': os.getpid(),
                'time': self.signed_at,
                'coordinator': self.coordinator_address
            }, f)
    except OSError as e:
      logging.warning('cannot sign the roll call in %s: %s', self.directory, e)

  def present(self, max_age_s: float) -> dict[int, dict]:
    """{process index: its entry} of the processes that signed for this
    coordinator."""
    out = {}
    for process_index in range(self.num_processes):
      try:
        with open(self._path(process_index)) as f:
          entry = json.load(f)
      except (OSError, ValueError):
        continue
      if (entry.get('coordinator') == self.coordinator_address and
          self.signed_at - entry.get('time', 0) < max_age_s):
        out[process_index] = entry
    return out

  def missing(self, max_age_s: float = 3600) -> list[int]:
    present = self.present(max_age_s)
    return [r for r in range(self.num_processes) if r not in present]

  def erase(self) -> None:
    try:
      os.remove(self._path(self.process_index))
    except OSError:
      pass


class Watch:
  """Ends this process, naming the absent, if joining takes too long.

  Example:
    >>> with Watch(roll, timeout_s=300):
    ...   jax.distributed.initialize(...)
  """

  def __init__(self, roll: Optional[RollCall], timeout_s: float):
    self.roll = roll
    self.timeout_s = timeout_s
    self._timer = threading.Timer(timeout_s, self._fire)
    self._timer.daemon = True

  def __enter__(self) -> 'Watch':
    if self.roll is not None:
      self.roll.sign()
    self._timer.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._timer.cancel()
    if self.roll is not None:
      self.roll.erase()

  def message(self) -> str:
    head = (f'the job did not form within {self.timeout_s:g} s '
            '(--initialization_timeout)')
    if self.roll is None:
      return head + ': some processes never joined.'
    missing = self.roll.missing(max_age_s=self.timeout_s * 2 + 60)
    if not missing:
      return head + ': every process signed the roll call but JAX could not ' \
          'join them; check that they all use the same coordinator address.'
    return (f'{head}: {", ".join(f"rank {r}" for r in missing)} of '
            f'{self.roll.num_processes} never joined (no sign of them in '
            f'{self.roll.directory}; if the workdir is not shared between '
            'hosts, this process can only see itself). Start them, or check '
            'their logs for an earlier error.')

  def _fire(self) -> NoReturn:
    logging.error('%s', self.message())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(  # pylint: disable=protected-access
        exit_codes.DISTRIBUTED_INIT_FAILED)
