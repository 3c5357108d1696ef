"""The job on a Ray cluster, one process per node: reserve, start, relay,
end with the job's exit code.

Each process is the per-process path every deployment runs (a cluster's
process, launcher/rank/process.py): supervision, the agreement, checkpoints,
goodput and the record are the job's own; this driver gives each its place
from Ray's own view of the group (never from the nodes' environment), shows
and files its output (WORKDIR/logs/rank_<i>.log, where the workdir is
local), and stops the others, after a grace, once one has failed.

Example:
  >>> run(Options(address='auto', num_processes=4,
  ...             resources_per_process={'GPU': 8},
  ...             launcher_args=['--config=configs/mnist.py',
  ...                            '--workdir=/shared/runs/mnist']))
  0
"""

import dataclasses
import os
import sys
import time
import uuid
from typing import Optional, TextIO

from launcher.common import output_prefix
from launcher.common import record_mirror
from runtime.common import exit_codes
from runtime.common import files
from runtime.common import layout
from runtime.common import records

_READ_EVERY_S = 0.2


@dataclasses.dataclass(frozen=True)
class Options:
  """What `podrun-ray` was asked.

  Attributes:
    address: the Ray cluster ('auto', or the head's HOST:PORT).
    num_processes: one per node.
    resources_per_process: one bundle, e.g. {'GPU': 8} or {'TPU': 4}.
    launcher_args: the launcher's flags, as for `podrun`.
    start_timeout_s: how long to wait for Ray to place every bundle.
    stop_grace_s: after a process failed, how long the others have to end
      on their own (their supervisors see the failure) before they are
      stopped; also SIGTERM's grace before SIGKILL.
  """
  address: str
  num_processes: int
  resources_per_process: dict[str, float]
  launcher_args: list[str]
  start_timeout_s: float = 120.0
  stop_grace_s: float = 30.0


def workdir_of(launcher_args: list[str]) -> Optional[str]:
  """The --workdir among the launcher's flags, or None."""
  for i, arg in enumerate(launcher_args):
    if arg.startswith('--workdir='):
      return arg.split('=', 1)[1]
    if arg == '--workdir' and i + 1 < len(launcher_args):
      return launcher_args[i + 1]
  return None


class _Logs:
  """Each process's output, whole, in WORKDIR/logs/rank_<i>.log; on the
  console with its `[rank i/N]` prefix (C++ code's lines lack it)."""

  def __init__(self, workdir: Optional[str], num_processes: int):
    self.num_processes = num_processes
    self.files: dict[int, TextIO] = {}
    self.record = None
    if workdir:
      self.record = layout.Record(
          record_mirror.local_copy(workdir)
          if record_mirror.in_bucket(workdir) else workdir)
      os.makedirs(self.record.logs(), exist_ok=True)
      self.files = {r: open(self.record.process_log(r), 'w')
                    for r in range(num_processes)}

  def job(self, job: dict) -> None:
    """WORKDIR/logs/job.json: the job's id, attempt and processes."""
    if self.record is not None:
      files.write_json(self.record.job(), job)

  def write(self, rank: int, stream: str, line: str) -> None:
    if rank in self.files:
      self.files[rank].write(line)
    if output_prefix.routine(line):
      return
    if not line.startswith('[rank '):
      line = output_prefix.prefix(rank, self.num_processes) + line
    (sys.stderr if stream == 'stderr' else sys.stdout).write(line)

  def close(self) -> None:
    for f in self.files.values():
      f.close()


def _say(text: str) -> None:
  print(f'[podrun-ray] {text}', file=sys.stderr, flush=True)


def run(options: Options) -> int:
  """Runs the job once on `options.num_processes` nodes; its exit code."""
  import ray  # pylint: disable=g-import-not-at-top
  from launcher.ray import group as group_lib  # pylint: disable=g-import-not-at-top
  ray.init(address=options.address, log_to_driver=False,
           logging_level='warning')
  job_id = uuid.uuid4().hex[:12]
  attempt = records.attempt_name(job_id, 1)
  try:
    group = group_lib.Group.reserve(options.num_processes,
                                    options.resources_per_process,
                                    options.start_timeout_s)
  except group_lib.CapacityError as e:
    _say(f'error: {e}')
    ray.shutdown()
    return exit_codes.POD_UNAVAILABLE
  logs = _Logs(workdir_of(options.launcher_args), options.num_processes)
  try:
    coordinator, pids = group.start(options.launcher_args, job_id, attempt)
    logs.job({'job_id': job_id, 'attempt': attempt,
              'coordinator_address': coordinator, 'ray_address': options.address,
              'ranks': [{'rank': r, 'pid': p, 'node': n} for r, (p, n) in
                        enumerate(zip(pids, group.nodes))]})
    _say(f'started {options.num_processes} processes, one a node, '
         f'coordinator {coordinator}, attempt {attempt}')
    return _monitor(group, logs, options.stop_grace_s)
  finally:
    group.remove()
    logs.close()
    ray.shutdown()


def _monitor(group, logs: _Logs, stop_grace_s: float) -> int:
  """Relays output until every process has ended; the job's exit code: its
  root cause's (exit_codes.root_cause, the rule of every launcher), else 0.
  Once the cause is known, the others have `stop_grace_s` to end on their
  own before they are stopped."""
  failed: list[tuple[float, int, int]] = []   # (when, code, rank)
  cause, stop_at = None, None
  while len(group.ended) < len(group.hosts):
    seen = set(group.ended)
    for rank, stream, line in group.read():
      logs.write(rank, stream, line)
    now = time.monotonic()
    failed += [(now, group.ended[r], r) for r in group.ended
               if r not in seen and group.ended[r] != exit_codes.OK]
    for rank in sorted(set(group.lost) - seen):
      _say(f'rank {rank} lost: its node {group.nodes[rank][:12]} is gone '
           f'({group.lost[rank]})')
    if cause is None:
      cause = exit_codes.root_cause([f[:2] for f in failed], now, False)
      if cause is not None:
        _, code, rank = failed[cause]
        _say(f'rank {rank} ended with exit code {code}'
             f'{exit_codes.signal_suffix(code)}; stopping the others in '
             f'{stop_grace_s:g} s if they have not ended')
        stop_at = now + stop_grace_s
    if stop_at is not None and now > stop_at:
      group.stop(stop_grace_s)
      stop_at = None
    time.sleep(_READ_EVERY_S)
  if cause is None:
    cause = exit_codes.root_cause([f[:2] for f in failed], 0.0, True)
  code = failed[cause][1] if cause is not None else exit_codes.OK
  _say(f'exit code {code}{exit_codes.signal_suffix(code)}')
  return code
