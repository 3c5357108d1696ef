"""A launcher's files in a bucket's record, written after its last attempt.

A launcher whose job keeps its record in a bucket (a TPU driver, a Ray
driver) knows what no process of the job can: every attempt, and how the
last one ended. After it, `complete` adds the launcher's attempts to
URL/logs/attempts.jsonl, rolls the goodput up over every attempt
(URL/goodput.jsonl, summary.json's `goodput`) and writes URL/logs/job.json.
Its processes run with PODRUN_LAUNCHER_RECORD=1, so that process 0 writes
none of these (layout.writer): each file of the record has one writer.

Example:
  >>> complete('gs://runs/mnist', 'tpu_logs/job-1/attempts.jsonl',
  ...          {'job_id': 'job-1', 'exit_code': 0}, say=print)
  {'goodput': 0.91, 'wall_s': 310.4, ...}
"""

import os
import tempfile
import threading
from typing import Callable, Optional

from launcher.common import goodput_rollup
from launcher.common import record_mirror
from runtime.common import layout
from runtime.common import records


def _write(url: str, attempts_path: str, job: records.Job) -> records.RollUp:
  """Merges the attempts into the bucket's, then fetches the record into a
  directory of its own, rolls it up, writes job.json and uploads the
  launcher's files; returns the roll-up."""
  record_mirror.merge_lines(url, f'{layout.LOGS}/{layout.ATTEMPTS}',
                            attempts_path)
  with tempfile.TemporaryDirectory(prefix='podrun_record_') as local:
    mirror = record_mirror.Mirror(url, local, owns=record_mirror.launcher_owns)
    mirror.fetch()
    record = layout.Record(local)
    result = goodput_rollup.roll_up_into_summary(record)
    job.write(record.job())
    mirror.push()
    if mirror.unwritten:
      raise RuntimeError(f'{", ".join(sorted(mirror.unwritten))} not written')
  return result


def complete(url: str, attempts_path: str, job: records.Job,
             say: Callable[[str], None]) -> Optional[records.RollUp]:
  """Completes the bucket record at `url` with the launcher's files.

  Bounded as a process's last upload is (record_mirror.FINISH_TIMEOUT_S);
  a warning, never an error, when the bucket cannot be reached.

  Args:
    url: the job's gs:// workdir.
    attempts_path: the launcher's attempts.jsonl on this machine.
    job: what logs/job.json says of the job.
    say: how to tell the user.

  Returns:
    the roll-up over every attempt, or None when nothing was written (no
    attempt ended, or the bucket did not answer).
  """
  if not os.path.exists(attempts_path):
    return None
  outcome: list = []

  def completing():
    try:
      outcome.append(_write(url, attempts_path, job))
    except Exception as e:  # pylint: disable=broad-except
      outcome.append(e)

  worker = threading.Thread(target=completing, name='record', daemon=True)
  worker.start()
  worker.join(record_mirror.FINISH_TIMEOUT_S)
  if outcome and not isinstance(outcome[0], Exception):
    return outcome[0]
  why = (outcome[0]
         if outcome else f'no answer in {record_mirror.FINISH_TIMEOUT_S:g} s')
  say(f'warning: cannot add the attempts and the goodput roll-up to {url} '
      f'({why}); the attempts are in {attempts_path}')
  return None


def finish(record: layout.Record,
           attempts_path: str,
           job: Optional[records.Job],
           say: Callable[[str], None],
           shown: Optional[str] = None) -> Optional[records.RollUp]:
  """A launcher's end of its job's record, the same for every launcher: a
  bucket's record is completed (`complete`), a shared one's goodput rolled
  up where it lies (its launcher wrote its attempts and job.json there);
  then the goodput is said in one line.

  Args:
    record: the job's record (layout.Record.of its --workdir).
    attempts_path: the launcher's attempts.jsonl on this machine.
    job: what a bucket's logs/job.json says of the job (None where the
      launcher wrote it in the record itself).
    say: how to tell the user.
    shown: the workdir as the user named it (default the record's).

  Returns:
    The roll-up over every attempt, or None where there is none.
  """
  if record.bucket and job is not None:
    result = complete(record.bucket, attempts_path, job, say)
  else:
    result = goodput_rollup.roll_up_into_summary(record)
  if result and result['goodput'] is not None:
    say(goodput_line(result, shown or record.bucket or record.workdir))
  return result


def goodput_line(result: records.RollUp, workdir: str) -> str:
  """The one line every launcher ends with, of a roll-up of `workdir`."""
  idle = result['between_commands_s']
  between = (f' (and {idle:.1f} s between commands, when nothing ran it)'
             if idle > 0 else '')
  return (f'goodput {result["goodput"]:.3f}: '
          f'{result["parts"]["productive"]:.1f} s of productive steps in '
          f'{result["wall_s"]:.1f} s over {len(result["attempts"])} '
          f'attempt(s){between}; podrun-goodput {workdir} shows where the '
          'rest went')
