"""The job on a Ray cluster, one process per node: attempts until one ends
for good, under the job agent, as every launcher (launcher/agent.py).

Each process is the per-process path every deployment runs (a cluster's
process, launcher/process/job.py): supervision, the agreement, checkpoints,
goodput and the record are the job's own; each attempt (attempt.py) gives
it its place from Ray's own view of the group (never from the node's
environment), shows and files its output (output.py), and stops the others,
after a grace, once one has failed. A SIGINT or SIGTERM to the driver is
every process's preemption notice: they save the step they agree on.

Example:
  >>> run(options_lib.RayFlags(address='auto', num_processes=4,
  ...         resources_per_process={'GPU': 8},
  ...         launcher_args=flag_values.LaunchArgs([
  ...             '--config=configs/mnist.py',
  ...             '--workdir=/shared/runs/mnist'])))
  0
"""

import dataclasses
import logging
import uuid

from launcher import agent
from launcher.common import launcher_record
from launcher.common import project as project_lib
from launcher.common import record_mirror
from launcher.ray import attempt as attempt_lib
from launcher.ray import elastic
from launcher.ray import options as options_lib
from launcher.ray import output
from runtime.common import exit_codes
from runtime.common import layout
from runtime.common import records


def runtime_env(found: project_lib.Project) -> dict:
  """Ray's runtime_env that ships `found` to every node: its directory as
  working_dir (each process starts in its copy there), and what does not
  travel (git's ignored files, .git itself) as excludes."""
  return {
      'working_dir': found.directory,
      'excludes': project_lib.left_out(found)
  }


def run(options: options_lib.RayFlags) -> int:
  """Runs the job to its end on `options.num_processes` nodes; its exit
  code."""
  try:
    found = project_lib.find(options.project_dir,
                             options.project_max_mb,
                             podrun_root=project_lib.podrun_root())
  except exit_codes.PodrunError as e:
    output.say(f'error: {e}')
    return e.exit_code
  output.say(f'the project {found.directory} ({len(found.files)} file(s), '
             f'{found.size / 2**20:.1f} MiB) goes to every node as Ray\'s '
             'working_dir')
  import ray  # pylint: disable=g-import-not-at-top
  try:
    ray.init(address=options.address,
             log_to_driver=False,
             logging_level=logging.WARNING,
             runtime_env=runtime_env(found))
  except ConnectionError as e:
    output.say(f'error: no Ray cluster at --address={options.address}: {e} '
               '(`ray start --head` starts one; `ray status` shows its '
               'address)')
    return exit_codes.POD_UNAVAILABLE
  job_id = uuid.uuid4().hex[:12]
  workdir = options.launcher_args.workdir
  assert workdir is not None  # podrun-ray refuses a job without one.
  logs = output.Logs(workdir, options.num_processes)
  if logs.record.bucket:
    _claim_the_copy(logs.record, job_id)
  capacity = elastic.Capacity(options.num_processes, options.min_processes or
                              options.num_processes)

  def finish(code: int) -> None:
    logs.close()
    ray.shutdown()
    _report_goodput(logs, job_id, code)

  code = agent.run(
      agent.Job(start=lambda start: attempt_lib.Attempt(options, start, job_id,
                                                        logs, capacity),
                restarts=options.restarts,
                logs_dir=logs.record.logs(),
                capacity=capacity,
                elastic=capacity.elastic,
                say=output.say,
                finish=finish))
  output.say(f'exit code {code}{exit_codes.signal_suffix(code)}')
  return code


def _claim_the_copy(record: layout.Record, job_id: str) -> None:
  """Makes this machine's copy of a bucket's record the job's before the
  driver files its logs there: else a process of the job on this machine
  would find files the bucket lacks and set the copy, logs and all,
  aside. A bucket that does not answer is the processes' to report."""
  bucket = record.bucket
  if bucket is None:
    return
  try:
    record_mirror.fetch_record(bucket, record.workdir, job_id=job_id)
  except Exception as e:  # pylint: disable=broad-except
    output.say(f'warning: cannot read {bucket}: {e}')


def _report_goodput(logs: output.Logs, job_id: str, code: int) -> None:
  """The job's goodput over every attempt, into the record's goodput.jsonl
  and summary.json, and said. A bucket's gets them, with the attempts and
  job.json, after the last attempt (launcher_record.py); this machine's
  copy of it, none."""
  launcher_record.finish(
      logs.record, logs.record.attempts(),
      dataclasses.replace(logs.job or records.Job(job_id, 'podrun-ray'),
                          exit_code=code), output.say)
