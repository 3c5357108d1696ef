"""--dry_run, --status and --stop: what a launch would do, and what runs.

Example:
  scripts/launch_tpu_pod.sh --tpu=run7 --zone=us-central2-b --status
  # queued resource run7: ACTIVE; node(s) run7 READY/HEALTHY
  # [worker 0] podrun: job run7-a1: running since ...
"""

import shlex
import subprocess
import sys

from launcher.tpu import commands
from launcher.tpu import queued
from runtime.common import exit_codes


def _planned_fleet(launch) -> list[str]:
  options, gcloud = launch.options, launch.gcloud
  if launch.fleet is None:
    return []
  request = launch.fleet.request
  return [
      shlex.join(gcloud.queued('describe', request.name, '--format=json')) +
      '  # must not exist yet',
      shlex.join(gcloud.queued('create', *request.create_args())),
      f'# wait: capacity <= {options.capacity_timeout:g} s, provisioning <= '
      f'{options.provisioning_timeout:g} s, READY and HEALTHY <= '
      f'{options.wait_healthy:g} s; every {options.poll_interval:g} s:',
      shlex.join(gcloud.queued('describe', request.name, '--format=json')),
  ]


def print_plan(launch) -> int:
  """--dry_run: every command, in order; runs none."""
  options, gcloud = launch.options, launch.gcloud
  short = '<code sha256[:16]>'
  workers = '<workers from describe>'
  minimum = commands.required_python(launch.jax_version)
  launch.coordinator = '<worker 0 of slice 0, from describe>'
  print(f'# job {launch.job_id}, logs in {launch.log_dir}')
  for line in _planned_fleet(launch):
    print(line)
  for node in launch.nodes:
    print(shlex.join(gcloud.describe(node)))
  if not options.skip_preflight:
    print('# preflight through cloud-tpu-client: READY, HEALTHY, '
          'config.topology.accelerator_type')
  for node in launch.nodes:
    for command in (
        gcloud.ssh(commands.PYTHON_PROBE.replace(
            'FIND', commands.find_python(options.worker_python, minimum)),
                   node=node),
        gcloud.scp('<tmp>/code.tar.gz', f'podrun-{short}.tar.gz', node),
        gcloud.ssh(commands.setup_command(short, options.worker_python,
                                          launch.jax_version), node=node)):
      print(shlex.join(command))
  for slice_id, node in enumerate(launch.nodes):
    print(shlex.join(gcloud.ssh(commands.run_command(
        short, launch.job_id, options.worker_python, options.env,
        launch.launcher_args, workers, options, 1, launch.place(slice_id)),
                                node=node)))
  if launch.fleet is not None:
    delete = shlex.join(gcloud.queued('delete', launch.fleet.request.name,
                                      '--force', '--quiet'))
    print(f'# at the end{" (--delete_after)" if options.delete_after else ""}'
          f', on Ctrl-C or SIGTERM{", or after a preemption" if options.max_restarts else ""}:'
          f' {delete}')
  print('# on a failure, Ctrl-C or SIGTERM:')
  for node in launch.nodes:
    print(shlex.join(gcloud.ssh(commands.stop_command(
        commands.attempt_id(launch.job_id, 1), options.stop_grace),
                                node=node)))
  return exit_codes.OK


def _queued_status(launch) -> bool:
  """Prints the queued resource's state; False when it has no live node."""
  request = queued.Request(launch.options.queued_resource, launch.nodes,
                           '', '')
  try:
    seen = queued.observe(launch.gcloud, request)
  except exit_codes.PodrunError as e:
    print(f'queued resource {request.name}: could not read it: {e}')
    return True
  if seen.queued == queued.NOT_FOUND:
    print(f'queued resource {request.name}: none (a slice created without '
          'one, or none at all)')
    return True
  print(f'queued resource {request.name}: {seen.describe()}')
  return seen.phase() == 'up'


def control(launch) -> int:
  """--stop and --status: one command on every worker of every slice,
  output as it comes; --status first shows the queued resource."""
  options = launch.options
  if options.status:
    if not _queued_status(launch):
      return exit_codes.OK
    command = commands.status_command()
  else:
    command = commands.stop_command(
        None if options.stop == 'all' else options.stop, options.stop_grace)
  codes = [_on_slice(launch, command, node) for node in launch.nodes]
  return next((c for c in codes if c), exit_codes.OK)


def _on_slice(launch, command: str, node: str) -> int:
  """Runs `command` on every worker of one slice; with several slices each
  line says which (a worker's index is its place in its own slice)."""
  ssh = launch.gcloud.ssh(command, node=node)
  if len(launch.nodes) == 1:
    return subprocess.run(ssh, stdin=subprocess.DEVNULL,
                          check=False).returncode
  result = subprocess.run(ssh, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, check=False)
  for line in result.stdout.splitlines():
    print(f'[slice {node}] {line}', flush=True)
  print(result.stderr, end='', file=sys.stderr, flush=True)
  return result.returncode
