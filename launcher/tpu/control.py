"""--dry_run, --status and --stop: what a launch would do, and what runs.

Example:
  scripts/launch_tpu_pod.sh --tpu=run7 --zone=us-central2-b --status
  # queued resource run7: ACTIVE; node(s) run7 READY/HEALTHY
  # [worker 0] podrun: job run7-a1: running since ...
"""

import glob
import json
import os
import shlex
import subprocess
import sys

from launcher.common import project as project_lib
from launcher.tpu import bundle
from launcher.tpu import commands
from launcher.tpu import elastic
from launcher.tpu import flags
from launcher.tpu import queued
from runtime.common import accelerators
from runtime.common import exit_codes


def _requests(launch) -> list[queued.Request]:
  """What the launch creates: one queued resource, or one per slice."""
  return launch.slices.requests()


def _planned_fleet(launch) -> list[str]:
  options, gcloud = launch.options, launch.gcloud
  lines = []
  for request in _requests(launch):
    lines += [
        shlex.join(gcloud.queued('describe', request.name, '--format=json')) +
        '  # must not exist yet',
        shlex.join(gcloud.queued('create', *request.create_args()))
    ]
  if not lines:
    return []
  return lines + [
      f'# wait: capacity <= {options.capacity_timeout:g} s, provisioning <= '
      f'{options.provisioning_timeout:g} s, READY and HEALTHY <= '
      f'{options.wait_healthy:g} s; every {options.poll_interval:g} s, each:',
      shlex.join(
          gcloud.queued('describe',
                        _requests(launch)[0].name, '--format=json'))
  ]


# The system Python of the images Google lists for JAX on TPU VMs (all
# Ubuntu 22.04), by the start of their name.
_IMAGE_PYTHON = {
    'tpu-ubuntu2204': (3, 10),
    'v2-alpha-tpuv5': (3, 10),
    'v2-alpha-tpuv6e': (3, 10)
}


def planned_workers(launch):
  """One slice's worker count as far as the flags tell it (the accelerator
  type of --create or of --config.topology.accelerator_type), else a
  placeholder for what describe will say."""
  accelerator_type = (
      launch.options.accelerator_type or
      launch.launcher_args.value('config.topology.accelerator_type') or '')
  try:
    return accelerators.slice_topology(accelerator_type).hosts
  except accelerators.AcceleratorTypeError:
    return '<workers from describe>'


def image_python_warning(launch) -> str:
  """A warning when --create's image has a Python too old for the JAX and
  nothing provides another; '' otherwise."""
  options = launch.options
  image = options.runtime_version
  system = next(
      (v for prefix, v in _IMAGE_PYTHON.items() if image.startswith(prefix)),
      None)
  minimum = commands.required_python(launch.jax_version)
  if (system is None or system >= minimum or options.worker_python or
      options.provision_python):
    return ''
  dotted = '.'.join(map(str, minimum))
  return (f'# warning: the image {image} has Python '
          f'{".".join(map(str, system))}, and JAX {launch.jax_version} needs '
          f'{dotted} or newer: unless the image has python{dotted} besides, '
          'the launch stops at the Python check. Add --provision_python (or '
          '--worker_python=PATH).')


def _code_said(project) -> str:
  """What the code archive holds, and where the job runs from in it."""
  podrun = (f"podrun's checkout {project_lib.PODRUN_SOURCE}"
            if project_lib.is_checkout() else
            f'podrun as installed in {project_lib.PODRUN_SOURCE}')
  if project is None or project.is_podrun:
    return f'the code: {podrun}; the job runs from it'
  return (f'the code: {podrun}, and the project {project.directory} '
          f'({len(project.files)} file(s), {project.size / 2**20:.1f} MiB), '
          'which the job runs from')


def print_plan(launch) -> int:
  """--dry_run: every command, in order; runs none."""
  options, gcloud = launch.options, launch.gcloud
  short = '<code sha256[:16]>'
  workers = planned_workers(launch)
  batch = workers if isinstance(workers, int) else '<workers>'
  minimum = commands.required_python(launch.jax_version)
  launch.coordinator = '<worker 0 of slice 0, from describe>'
  print(f'# job {launch.job_id}, logs in {launch.log_dir}')
  print(f'# {_code_said(launch.project)}')
  for line in [*_planned_fleet(launch), image_python_warning(launch)]:
    if line:
      print(line)
  for node in launch.nodes:
    print(shlex.join(gcloud.describe(node)))
  if not options.skip_preflight:
    print('# preflight through the Cloud TPU API: READY, HEALTHY, '
          'config.topology.accelerator_type')
  for node in launch.nodes:
    for command in (gcloud.ssh(commands.PYTHON_PROBE.replace(
        'FIND', commands.find_python(options.worker_python, minimum)),
                               node=node,
                               workers=batch),
                    gcloud.scp('<tmp>/code.tar.gz', f'podrun-{short}.tar.gz',
                               node),
                    gcloud.ssh(commands.setup_command(short,
                                                      options.worker_python,
                                                      launch.jax_version),
                               node=node,
                               workers=batch)):
      print(shlex.join(command))
  for slice_id, node in enumerate(launch.nodes):
    print(
        shlex.join(
            gcloud.ssh(commands.run_command(
                short, launch.job_id, options.worker_python, launch.told(),
                list(options.env), launch.launcher_args, workers, options, 1,
                launch.place(slice_id), bundle.run_directory(launch.project)),
                       node=node,
                       workers=batch)))
  for request in _requests(launch):
    delete = shlex.join(
        gcloud.queued('delete', request.name, '--force', '--quiet'))
    after_delete = ' (--delete_after)' if options.delete_after else ''
    relaunched = (', or after a preemption'
                  if options.restarts.max_restarts else '')
    print(f'# at the end{after_delete}, on Ctrl-C or SIGTERM{relaunched}: '
          f'{delete}')
  if isinstance(launch.slices, elastic.SliceGroup):
    print(f'# a lost slice: the job relaunches at once on the others (at '
          f'least --min_slices={options.min_slices}) while that slice is '
          'deleted, created and set up again; then it grows back at a step '
          'boundary')
  print('# on a failure, Ctrl-C or SIGTERM:')
  for node in launch.nodes:
    print(
        shlex.join(
            gcloud.ssh(commands.stop_command(
                commands.attempt_id(launch.job_id, 1), options.stop_grace),
                       node=node,
                       workers=batch)))
  return exit_codes.OK


def _queued_status(launch) -> tuple[str, ...]:
  """Prints the queued resource's state (an elastic launch's, each
  slice's); returns the nodes that are up (every node without --create)."""
  request = queued.Request(launch.options.queued_resource, launch.all_nodes, '',
                           '')
  if not launch.options.min_slices:
    return launch.all_nodes if _one_queued_status(launch, request) else ()
  up = tuple(r.nodes[0]
             for r in elastic.requests(request)
             if _one_queued_status(launch, r))
  for line in elastic.status_lines(_log_dirs(launch.options),
                                   launch.options.tpu):
    print(line)
  return up


def _log_dirs(options: flags.PodFlags) -> list[str]:
  """Where a driver of this machine may say how its slices stand: its
  --log_dir, else every launch's default one under ./tpu_logs."""
  if options.log_dir:
    return [options.log_dir]
  return sorted(glob.glob(os.path.join('tpu_logs', '*')))


def _one_queued_status(launch, request: queued.Request) -> bool:
  try:
    seen = queued.observe(launch.gcloud, request)
  except exit_codes.PodrunError as e:
    print(f'queued resource {request.name}: could not read it: {e}')
    return True
  if seen.queued == queued.NOT_FOUND:
    print(f'queued resource {request.name}: none (a slice created without '
          'one, or none at all)')
    return True
  print(f'queued resource {request.name}: {seen.describe()}' +
        ('' if seen.phase() == 'up' or not launch.options.min_slices else
         ' (not in the job: coming back)'))
  return seen.phase() == 'up'


def control(launch) -> int:
  """--stop and --status: one command on every worker of every slice,
  output as it comes; --status first shows the queued resource."""
  options = launch.options
  nodes = launch.all_nodes
  if options.status:
    nodes = _queued_status(launch)
    if not nodes:
      return exit_codes.OK
    command = commands.status_command()
  else:
    command = commands.stop_command(
        None if options.stop == 'all' else options.stop, options.stop_grace)
  codes = [_on_slice(launch, command, node) for node in nodes]
  return next((c for c in codes if c), exit_codes.OK)


def _workers_of(launch, node: str):
  """The slice's worker count from describe, for ssh's --batch-size; None
  when describe fails (the ssh then says why)."""
  result = subprocess.run(launch.gcloud.describe(node),
                          stdin=subprocess.DEVNULL,
                          capture_output=True,
                          text=True,
                          check=False)
  try:
    return len(json.loads(result.stdout).get('networkEndpoints') or []) or None
  except (ValueError, AttributeError):
    return None


def _on_slice(launch, command: str, node: str) -> int:
  """Runs `command` on every worker of one slice; with several slices each
  line says which (a worker's index is its place in its own slice)."""
  ssh = launch.gcloud.ssh(command, node=node, workers=_workers_of(launch, node))
  if len(launch.nodes) == 1:
    return subprocess.run(ssh, stdin=subprocess.DEVNULL, check=False).returncode
  result = subprocess.run(ssh,
                          stdin=subprocess.DEVNULL,
                          capture_output=True,
                          text=True,
                          check=False)
  for line in result.stdout.splitlines():
    print(f'[slice {node}] {line}', flush=True)
  print(result.stderr, end='', file=sys.stderr, flush=True)
  return result.returncode
