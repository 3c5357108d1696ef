"""The TPU driver's part of a bucket's record: the launcher's files.

No process on the VMs can write them, since the processes end before the
driver knows its last attempt: after it, the driver adds its attempts to
URL/logs/attempts.jsonl, writes URL/logs/job.json, and rolls the goodput
up over every attempt (URL/goodput.jsonl, summary.json's goodput). Its
workers run with PODRUN_LAUNCHER_RECORD=1 (launch.py), so that process 0
writes none of these (layout.writer): each file has one writer.

Example:
  >>> complete(launch, code=0)    # --workdir=gs://runs/mnist
"""

import os
import tempfile
import threading

from launcher.common import flag_values
from launcher.common import goodput_rollup
from launcher.common import record_mirror
from launcher.tpu import launch as launch_lib
from runtime.common import files
from runtime.common import layout


def _job_record(launch: launch_lib.Launch, code: int) -> dict:
  """WORKDIR/logs/job.json of a TPU launch: where and how the job ran."""
  return {'job_id': launch.job_id, 'launched_by': 'launch_tpu_pod',
          'exit_code': code, 'tpu': launch.options.tpu,
          'zone': launch.options.zone, 'slices': list(launch.all_nodes),
          'workers_per_slice': launch.workers,
          'accelerator_type': launch.options.accelerator_type or None,
          'launcher_args': launch.launcher_args, 'log_dir': launch.log_dir}


def _complete_the_record(launch: launch_lib.Launch, url: str, path: str,
                         code: int) -> None:
  """Adds the attempts to URL/logs/attempts.jsonl, then the roll-up over
  every attempt (URL/goodput.jsonl, the goodput of URL/summary.json) and
  URL/logs/job.json: the launcher's files, which no process on the VMs
  could write (they end before the driver's last attempt is known)."""
  record_mirror.merge_lines(url, f'{layout.LOGS}/{layout.ATTEMPTS}', path)
  with tempfile.TemporaryDirectory(prefix='podrun_record_') as local:
    mirror = record_mirror.Mirror(url, local,
                                  owns=record_mirror.launcher_owns)
    mirror.fetch()
    goodput_rollup.roll_up_into_summary(local)
    files.write_json(layout.Record(local).job(),
                     _job_record(launch, code))
    mirror.push()
    if mirror.unwritten:
      raise RuntimeError(f'{", ".join(sorted(mirror.unwritten))} not written')


def complete(launch: launch_lib.Launch, code: int) -> None:
  """When the workdir is a bucket, completes its record with this launch's
  part (`_complete_the_record`), so that scripts/goodput.py gs://... and
  summary.json account for every attempt; bounded, as a process's last
  upload is. A warning, never an error, when the bucket cannot be
  reached: the attempts stay in LOG_DIR/attempts.jsonl."""
  url = flag_values.workdir_of(launch.launcher_args) or ''
  path = launch.path(layout.ATTEMPTS)
  if not layout.in_bucket(url) or not os.path.exists(path):
    return
  failed: list[Exception] = []

  def completing():
    try:
      _complete_the_record(launch, url, path, code)
    except Exception as e:  # pylint: disable=broad-except
      failed.append(e)

  worker = threading.Thread(target=completing, name='record', daemon=True)
  worker.start()
  worker.join(record_mirror.FINISH_TIMEOUT_S)
  if worker.is_alive() or failed:
    why = (failed[0] if failed else
           f'no answer in {record_mirror.FINISH_TIMEOUT_S:g} s')
    launch.say(f'warning: cannot add the attempts and the goodput roll-up '
               f'to {url} ({why}); the attempts are in {path}')
