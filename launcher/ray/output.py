"""What the processes of a job on Ray say: each one's output, whole, in
WORKDIR/logs/rank_<i>.log (where the driver reaches the workdir), and on the
console with its `[rank i/N]` prefix, routine lines left out (as the local
pod shows them); the attempt's processes in logs/job.json.

Example:
  >>> logs = Logs('/shared/mnist', num_processes=4)
  >>> logs.start(1, {'job_id': '3f2a', ...})
  >>> logs.write(2, 'stderr', 'W1203 ... slow step\n')
"""

import os
import sys
from typing import Optional, TextIO

from launcher.common import output_prefix
from runtime.common import layout
from runtime.common import records


def say(text: str) -> None:
  print(f'[podrun-ray] {text}', file=sys.stderr, flush=True)


class Logs:
  """The rank logs and job.json of a job's attempts.

  Args:
    workdir: the job's --workdir (for a gs:// one, this machine's copy
      holds the logs).
    num_processes: processes in the job.
  """

  def __init__(self, workdir: str, num_processes: int):
    self.num_processes = num_processes
    self.files: dict[int, TextIO] = {}
    self.record = layout.Record.of(workdir)
    # What the last attempt's job.json says (None before one started).
    self.job: Optional[records.Job] = None

  def start(self, attempt: int, job: records.Job) -> None:
    """Opens the rank logs for `attempt` (a later one appends, under a
    header) and writes job.json."""
    self.close()
    os.makedirs(self.record.logs(), exist_ok=True)
    for process_index in range(self.num_processes):
      log = open(self.record.process_log(process_index),
                 'a' if attempt > 1 else 'w')
      if attempt > 1:
        log.write(f'===== attempt {attempt} =====\n')
      self.files[process_index] = log
    job.write(self.record.job())
    self.job = job

  def write(self, process_index: int, stream: str, line: str) -> None:
    if process_index in self.files:
      self.files[process_index].write(line)
    if output_prefix.routine(line):
      return
    if not line.startswith('[rank '):
      line = output_prefix.prefix(process_index, self.num_processes) + line
    (sys.stderr if stream == 'stderr' else sys.stdout).write(line)

  def close(self) -> None:
    for log in self.files.values():
      log.close()
    self.files = {}
