"""The shell commands the TPU pod driver runs on every worker.

Each is a string for `gcloud ... ssh --worker=all --command=...`, which the
worker's login shell (bash) parses again, so every word that comes from the
user is quoted with shlex. The worker half is launcher/tpu/worker.py, copied
to ~/podrun/tpu_worker.py by the set-up command.

Example:
  >>> stop_command('run7-a1', grace=60)
  'python3 "$HOME/podrun/tpu_worker.py" stop run7-a1 --grace=60'
"""

import dataclasses
import importlib.metadata
import re
import shlex
import subprocess
from typing import Optional

from launcher.common import flag_values
from launcher.common import job_tls
from launcher.tpu import flags
from runtime.common import handoff
from runtime.common import exit_codes
from runtime.common import layout
from runtime.common import records

WORKER_SCRIPT = '$HOME/podrun/tpu_worker.py'
# The parts of the code's archive (launcher/tpu/bundle.py).
PODRUN, PROJECT = 'podrun', 'project'


@dataclasses.dataclass
class Gcloud:
  """The gcloud commands of one launch. Every call gets /dev/null as stdin:
  each ssh client reads its stdin, and would eat whatever it is given.

  `tpu` is the node the commands address unless another is named (one
  slice of several: NAME-0, NAME-1, ...).
  """
  tpu: str
  zone: str
  project: str = ''

  def _where(self) -> list[str]:
    return [f'--zone={self.zone}'
           ] + ([f'--project={self.project}'] if self.project else [])

  def base(self, verb: str) -> list[str]:
    return ['gcloud', 'compute', 'tpus', 'tpu-vm', verb, *self._where()]

  def ssh(self,
          command: str,
          worker: str = 'all',
          node: str = '',
          workers=None) -> list[str]:
    """`workers`, when known, sets --batch-size to all of them: gcloud
    otherwise runs 64 at a time, and a job on worker 64 would start only
    once workers 0-63 had ended."""
    batch = [f'--batch-size={workers}'] if workers and worker == 'all' else []
    return [
        *self.base('ssh'), node or self.tpu, f'--worker={worker}', *batch,
        f'--command={command}'
    ]

  def scp(self, source: str, dest: str, node: str = '') -> list[str]:
    return [
        *self.base('scp'), source, f'{node or self.tpu}:{dest}', '--worker=all'
    ]

  def firewall_rules(self) -> list[str]:
    """Every firewall rule of the project, as JSON (rules are global)."""
    return [
        'gcloud', 'compute', 'firewall-rules', 'list', '--format=json',
        *([f'--project={self.project}'] if self.project else [])
    ]

  def describe(self, node: str = '') -> list[str]:
    return [*self.base('describe'), node or self.tpu, '--format=json']

  def queued(self, verb: str, *args: str) -> list[str]:
    """`gcloud compute tpus queued-resources VERB ARGS --zone ...`."""
    return [
        'gcloud', 'compute', 'tpus', 'queued-resources', verb, *args,
        *self._where()
    ]


def run_logged(command: list[str],
               log_path: str,
               own_session: bool = False) -> subprocess.CompletedProcess:
  """Runs a gcloud command to the end, its output appended to log_path.

  own_session: for clean-up (stop, delete), which a second Ctrl-C from the
  terminal, sent to our whole process group, must not cut short.
  """
  with open(log_path, 'a') as log:
    log.write(f'$ {shlex.join(command)}\n')
    log.flush()
    return subprocess.run(command,
                          stdin=subprocess.DEVNULL,
                          stdout=log,
                          stderr=subprocess.STDOUT,
                          check=False,
                          start_new_session=own_session)


class LaunchError(exit_codes.PodrunError):
  """The launch cannot go on; `exit_code` says why (CONFIG_ERROR unless
  given)."""
  exit_code = exit_codes.CONFIG_ERROR


# The oldest Python each JAX release runs on, newest release first: JAX 0.11
# dropped Python 3.11.
_JAX_MIN_PYTHON = (((0, 11), (3, 12)), ((0, 0), (3, 11)))


def worker_jax_version() -> str:
  """The JAX version the workers install: this environment's own.

  Read from the installed package's metadata (nothing is imported), so that
  every worker runs the JAX the launch was tried with.

  Raises:
    LaunchError: when this environment has no JAX.
  """
  try:
    return importlib.metadata.version('jax')
  except importlib.metadata.PackageNotFoundError as e:
    raise LaunchError(
        'this Python has no jax installed, so there is no JAX version for '
        'the workers to install: run scripts/launch_tpu_pod.sh without '
        'PODRUN_LOCAL_PYTHON (it uses .venv), or `pip install -e ".[pod]"` '
        'into this Python.') from e


def required_python(jax_version: str) -> tuple[int, int]:
  """The oldest Python that `jax_version` runs on, e.g. (3, 12) for 0.12.0.

  Example:
    >>> required_python('0.10.2')
    (3, 11)
  """
  release = tuple(int(x) for x in re.findall(r'\d+', jax_version)[:2])
  return next(python for first, python in _JAX_MIN_PYTHON if release >= first)


def _dotted(version: tuple[int, int]) -> str:
  return '.'.join(map(str, version))


# Sets $py, on a worker, to the first candidate that can run the job: the
# required Python (MIN) or newer, with its venv module. $found lists what was
# tried.
_FIND_PYTHON = r'''py=''; found=''
for p in CANDIDATES; do
  path="$(command -v "$p" 2>/dev/null)" || continue
  v="$("$path" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" || continue
  ok="$("$path" -c 'import sys, venv, ensurepip; print(int(sys.version_info >= (MIN)))' 2>/dev/null || echo novenv)"
  found="$found $path=$v"; [ "$ok" = novenv ] && found="$found(no venv module)"
  if [ "$ok" = 1 ]; then py="$path"; break; fi
done'''
# Prints one line per worker: `[worker W] podrun-python: ok|missing ...`.
PYTHON_PROBE = r'''w="${PROCESS_ID:-${TPU_WORKER_ID:-$(curl -sf -m 3 -H 'Metadata-Flavor: Google' http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number 2>/dev/null || echo '?')}}"
FIND
if [ -n "$py" ]; then mkdir -p "$HOME/podrun" && printf '%s\n' "$py" > "$HOME/podrun/python" && echo "[worker $w] podrun-python: ok $py"; else echo "[worker $w] podrun-python: missing${found:- nothing}"; fi'''
PYTHON_PROBE = PYTHON_PROBE.replace('PROCESS_ID',
                                    handoff.variable('process_id'), 1)
# The interpreter the check found on a worker, which its set-up uses: the
# check always runs first, also on a recreated slice's new VMs.
FOUND_PYTHON = '$HOME/podrun/python'
_DEFAULT_CANDIDATES = ('python3.13', 'python3.12', 'python3.11', 'python3')


def find_python(worker_python: str, minimum: tuple[int, int] = (3, 11)) -> str:
  """The shell snippet that sets $py on a worker (see _FIND_PYTHON).

  Args:
    worker_python: --worker_python, or '' to try python3.13 ... python3.
    minimum: the oldest Python the job's JAX runs on.
  """
  candidates = (shlex.quote(worker_python)
                if worker_python else ' '.join(_DEFAULT_CANDIDATES))
  return _FIND_PYTHON.replace('CANDIDATES',
                              candidates).replace('MIN',
                                                  ', '.join(map(str, minimum)))


def check_pythons(gcloud: Gcloud,
                  worker_python: str,
                  log_path: str,
                  jax_version: str,
                  node: str = '',
                  workers: Optional[int] = None) -> dict[str, str]:
  """{worker: interpreter path} that can run the job, on every worker.

  Args:
    gcloud: the pod's commands.
    worker_python: --worker_python, or ''.
    log_path: where the probe's output goes.
    jax_version: the JAX the workers run, which decides the oldest Python.
    node: the slice to check (default: gcloud's own).
    workers: the slice's worker count, for ssh's --batch-size.

  Raises:
    LaunchError: naming each worker without one, what it found and the fix.
  """
  minimum = _dotted(required_python(jax_version))
  probe = PYTHON_PROBE.replace(
      'FIND', find_python(worker_python, required_python(jax_version)))
  result = subprocess.run(gcloud.ssh(probe, node=node, workers=workers),
                          stdin=subprocess.DEVNULL,
                          capture_output=True,
                          text=True,
                          check=False)
  with open(log_path, 'a') as log:
    log.write(f'$ (python check{" of " + node if node else ""})\n'
              f'{result.stdout}{result.stderr}')
  found, problems = {}, []
  for line in result.stdout.splitlines():
    match = re.match(r'^\[worker (\S+)\] podrun-python: (ok|missing) ?(.*)$',
                     line)
    if not match:
      continue
    worker, status, detail = match.groups()
    if status == 'ok':
      found[worker] = detail.split()[0]
    else:
      problems.append(f'worker {worker}: found {detail.strip() or "nothing"}')
  if problems or not found:
    raise LaunchError(
        f'no worker Python can run the job (JAX {jax_version} needs Python '
        f'{minimum} or newer, with its venv module):\n  ' +
        '\n  '.join(problems or [result.stderr.strip()[-500:]]) +
        f'\nFix: launch with --provision_python, which installs '
        f'python{minimum} and python{minimum}-venv from the deadsnakes PPA '
        'with sudo apt-get on the workers that lack them, or install an interpreter yourself, or '
        'name one with --worker_python=PATH. Nothing was copied or started.')
  return found


# Installs the required Python (VERSION) with venv where no usable
# interpreter is found (Ubuntu 22.04 TPU images: python3 is 3.10); does
# nothing elsewhere.
_PROVISION = r'''FIND
if [ -z "$py" ]; then
  sudo add-apt-repository -y ppa:deadsnakes/ppa >/dev/null
  sudo apt-get update -q >/dev/null
  sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q pythonVERSION pythonVERSION-venv >/dev/null
fi'''


def provision_command(worker_python: str, jax_version: str) -> str:
  """Installs the Python `jax_version` needs (deadsnakes) on every worker
  that lacks one."""
  minimum = required_python(jax_version)
  return _PROVISION.replace('FIND', find_python(worker_python,
                                                minimum)).replace(
                                                    'VERSION', _dotted(minimum))


def tls_dir(job_id: str) -> str:
  """Where a launch's certificate authority lives on its workers, under
  their home ('~' as the job's launcher expands it)."""
  return f'~/podrun/tls-{job_tls.uri_part(job_id)}'


def setup_command(short_hash: str,
                  worker_python: str,
                  jax_version: str,
                  tls_job: str = '') -> str:
  """Unpacks the code (bundle.py: podrun/ and the project/) and, once per
  pyproject.toml and JAX version, installs ~/podrun/venv with podrun and
  exactly that JAX; with `tls_job`, unpacks the launch's authority (copied
  as ~/podrun-tls-JOB.tar.gz) into a directory only the user reads."""
  code = f'$HOME/podrun/code-{short_hash}'
  steps = [
      'set -e',
      f'd="{code}"',
      'mkdir -p "$HOME/podrun"',
      'if [ ! -f "$d/.podrun-ready" ]; then rm -rf "$d"; mkdir -p "$d"; '
      f'tar -xzf "$HOME/podrun-{short_hash}.tar.gz" -C "$d"; '
      'touch "$d/.podrun-ready"; fi',
      *_unpack_authority(tls_job),
      f'cp "$d/{PODRUN}/launcher/tpu/worker.py" "{WORKER_SCRIPT}"',
      f'cp "$d/{PODRUN}/launcher/tpu/worker_accelerator.py" '
      '"$HOME/podrun/tpu_worker_accelerator.py"',
  ]
  if not worker_python:
    # One environment for every version of the code, reinstalled only when
    # pyproject.toml changes: the job imports podrun from the code's own
    # copy (PYTHONPATH, run_command), so only the dependencies must match.
    jax = shlex.quote(f'jax[tpu]=={jax_version}')
    steps += [
        f'py="$(cat "{FOUND_PYTHON}")"',
        'v="$HOME/podrun/venv"',
        f's="$v/.podrun-$(sha256sum "$d/{PODRUN}/pyproject.toml" | '
        f'cut -c1-16)-{jax_version}"',
        'if [ ! -f "$s" ]; then rm -rf "$v"; "$py" -m venv "$v"; '
        '"$v/bin/pip" install -q --upgrade pip; '
        f'"$v/bin/pip" install -q "$d/{PODRUN}[tpu]" {jax}; touch "$s"; fi',
    ]
  return '; '.join(steps)


def _unpack_authority(tls_job: str) -> list[str]:
  if not tls_job:
    return []
  name = job_tls.uri_part(tls_job)
  where = '"$HOME/podrun/tls-' + name + '"'
  archive = '"$HOME/podrun-tls-' + name + '.tar.gz"'
  return [
      f'if [ -f {archive} ]; then (umask 077; rm -rf {where}; '
      f'mkdir -p {where}; tar -xzf {archive} -C {where}; '
      f'rm -f {archive}); fi'
  ]


def attempt_id(job_id: str, attempt: int) -> str:
  """The name of one attempt of a job on the workers (worker.base_id)."""
  return records.attempt_name(job_id, attempt)


@dataclasses.dataclass(frozen=True)
class SlicePlace:
  """Where one slice sits in a multislice job (see multislice_env).

  Attributes:
    slice_id: this slice's index, 0 ... num_slices - 1.
    num_slices: slices in the job.
    coordinator: slice 0's worker 0, which every worker of every slice
      reaches over the data-centre network.
    port: MEGASCALE_PORT.
  """
  slice_id: int = 0
  num_slices: int = 1
  coordinator: str = ''
  port: int = 8080


def multislice_env(place: SlicePlace) -> list[str]:
  """The MEGASCALE_* variables every worker of a multislice job needs;
  none for one slice.

  Example:
    >>> multislice_env(SlicePlace(1, 2, '10.0.0.2', 8080))[:2]
    ['MEGASCALE_COORDINATOR_ADDRESS=10.0.0.2', 'MEGASCALE_NUM_SLICES=2']
  """
  if place.num_slices == 1:
    return []
  return [
      f'MEGASCALE_COORDINATOR_ADDRESS={place.coordinator}',
      f'MEGASCALE_NUM_SLICES={place.num_slices}',
      f'MEGASCALE_SLICE_ID={place.slice_id}', f'MEGASCALE_PORT={place.port}'
  ]


def run_command(short_hash: str,
                job_id: str,
                worker_python: str,
                told: handoff.Handoff,
                envs: list[str],
                launcher_args: flag_values.LaunchArgs,
                workers,
                options: flags.PodFlags,
                attempt=1,
                place: SlicePlace = SlicePlace(),
                run_directory: str = PODRUN) -> str:
  """The command every worker of one slice runs: tpu_worker.py run, every
  word quoted, in the code's `run_directory` (bundle.py: 'project', or
  'podrun' for podrun's own checkout), with podrun's code first on
  PYTHONPATH.

  Every attempt is a job of its own on the workers, JOB_ID-aN, so that a
  restart starts afresh while a rerun of the same command attaches; they
  share the workdir lease through PODRUN_JOB_ID. `workers` is one slice's;
  the job must find workers x slices processes. Each process is told
  `told` with the job id and attempt, and gets the user's `envs`
  (NAME=VALUE, --env) after it.
  """
  python = (shlex.quote(worker_python)
            if worker_python else '"$HOME/podrun/venv/bin/python"')
  expected = (workers *
              place.num_slices if isinstance(workers, int) else workers)
  words = [
      f'--expected_processes={expected}',
      f'--stop_grace={options.stop_grace:g}',
      f'--orphan_timeout={options.orphan_timeout:g}',
      f'--accelerator_devices={options.accelerator_devices}'
  ]
  if place.num_slices > 1:
    words += [
        f'--slice_id={place.slice_id}', f'--num_slices={place.num_slices}'
    ]
  if options.replace:
    words.append('--replace')
  if options.kill_accelerator_holders:
    words.append('--kill_accelerator_holders')
  # The driver completes a bucket's record after its last attempt
  # (launcher_record.py): process 0 writes none of the launcher's files.
  told = dataclasses.replace(told,
                             job_id=job_id,
                             attempt=attempt_id(job_id, attempt),
                             launcher_record=layout.in_bucket(
                                 launcher_args.workdir))
  words += [
      f'--env={e}' for e in [
          *(f'{k}={v}'
            for k, v in told.env().items()), *multislice_env(place), *envs
      ]
  ]
  code = f'$HOME/podrun/code-{short_hash}'
  return (f'cd "{code}/{run_directory}" && exec python3 '
          f'"{WORKER_SCRIPT}" run '
          f'{shlex.quote(attempt_id(job_id, attempt))} --python={python} '
          f'"--env=PYTHONPATH={code}/{PODRUN}" ' +
          shlex.join(words + ['--', *launcher_args]))


def stop_command(job_id: Optional[str], grace: float) -> str:
  target = shlex.quote(job_id) if job_id else '--all'
  return f'python3 "{WORKER_SCRIPT}" stop {target} --grace={grace:g}'


def gone_command(job_id: str, processes: list[int], why: str) -> str:
  """Tells the job on a worker that these processes' hosts are gone."""
  return (f'python3 "{WORKER_SCRIPT}" gone {shlex.quote(job_id)} '
          f'--processes={",".join(map(str, processes))} '
          f'--why={shlex.quote(why)}')


def status_command() -> str:
  return f'python3 "{WORKER_SCRIPT}" status'
