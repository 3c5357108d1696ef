"""Getting a slice ready before the job runs on it: described, checked, the
code copied and set up on every worker.

Again for a slice recreated later (its VMs start with empty disks), with
the very code archive the others got. JAX-free, as the whole driver.

Example:
  >>> setup = SliceSetup(gcloud, options, launcher_args, 'job-1', say,
  ...                    'tpu_logs/job-1/gcloud.log', stop_if_interrupted,
  ...                    lambda: '0.10.2', lambda: authority)
  >>> setup.prepare(('fleet-0', 'fleet-1'))
  >>> setup.workers, setup.code_hash
  (4, '3f2a9c0d1e2b4a5c')
"""

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import weakref
from typing import Callable, Optional, Sequence

from launcher import tls
from launcher.common import project as project_lib
from launcher.tpu import bundle as bundle_lib
from launcher.tpu import commands
from launcher.tpu import firewall
from launcher.tpu import flags
from launcher.tpu import preflight as preflight_lib
from launcher.tpu.commands import LaunchError
from runtime.common import accelerators
from runtime.common import exit_codes
from launcher.common import job_tls


@dataclasses.dataclass(frozen=True)
class SliceInfo:
  """One slice as `gcloud ... describe` shows it."""
  workers: int
  accelerator_type: str
  # Worker 0's address: slice 0's is every slice's MEGASCALE coordinator.
  first_address: str
  # The VPC network its workers are on (its name).
  network: str = 'default'


def describe_slice(gcloud: commands.Gcloud, node: str,
                   log_path: str) -> SliceInfo:
  """The slice's workers, accelerator type and first worker's address.

  Raises:
    LaunchError: when describe fails, or its endpoints and its
      accelerator type disagree on the number of hosts.
  """
  command = gcloud.describe(node)
  result = subprocess.run(command,
                          stdin=subprocess.DEVNULL,
                          capture_output=True,
                          text=True,
                          check=False)
  with open(log_path, 'a') as log:
    log.write(f'$ {shlex.join(command)}\n{result.stdout}{result.stderr}')
  if result.returncode:
    raise LaunchError(
        f'gcloud could not describe TPU {node} in {gcloud.zone}: '
        f'{result.stderr.strip()[-500:]}',
        exit_code=exit_codes.POD_UNAVAILABLE)
  info = json.loads(result.stdout)
  endpoints = info.get('networkEndpoints') or []
  kind = (info.get('acceleratorType') or '').rsplit('/', 1)[-1]
  try:
    hosts = accelerators.slice_topology(kind).hosts
  except accelerators.AcceleratorTypeError:
    hosts = len(endpoints)
  if endpoints and hosts != len(endpoints):
    raise LaunchError(
        f'TPU {node} is {kind}, which has {hosts} host(s), but describe '
        f'lists {len(endpoints)} worker endpoint(s); recreate the pod or '
        'check it with `gcloud compute tpus tpu-vm describe`.',
        exit_code=exit_codes.TOPOLOGY_MISMATCH)
  first = endpoints[0].get('ipAddress', '') if endpoints else ''
  network = ((info.get('networkConfig') or {}).get('network') or
             'default').rsplit('/', 1)[-1]
  return SliceInfo(len(endpoints) or hosts, kind, first, network)


def check_slices_agree(infos: dict[str, SliceInfo]) -> None:
  """Every slice of a multislice job must be the same.

  Raises:
    LaunchError: TOPOLOGY_MISMATCH, naming each slice's type and workers.
  """
  shapes = {(i.accelerator_type, i.workers) for i in infos.values()}
  if len(shapes) > 1:
    raise LaunchError(
        'the slices differ: ' +
        ', '.join(f'{n} is {i.accelerator_type} with {i.workers} worker(s)'
                  for n, i in infos.items()) +
        '; a multislice job needs slices '
        'of one type.',
        exit_code=exit_codes.TOPOLOGY_MISMATCH)


class SliceSetup:
  """What the launch's slices went through before the job runs on them.

  Attributes:
    infos: {node: SliceInfo} of every slice described so far.
    workers: workers per slice (every slice has as many); 0 before any.
    code_hash: the first 16 hex digits of the code archive's SHA-256 once
      it is set up on the workers ('' before).
  """

  def __init__(self,
               gcloud: commands.Gcloud,
               options: flags.PodFlags,
               launcher_args: Sequence[str],
               job_id: str,
               say: Callable[[str], None],
               gcloud_log: str,
               stop_if_interrupted: Callable[[], None],
               jax_version: Callable[[], str],
               authority: Callable[[], tls.PodAuthority],
               project: Optional[project_lib.Project] = None):
    self.gcloud, self.options = gcloud, options
    self.launcher_args, self.job_id, self.say = launcher_args, job_id, say
    self.gcloud_log = gcloud_log
    self._stop_if_interrupted = stop_if_interrupted
    self._jax_version, self._authority = jax_version, authority
    self.project = project
    self.infos: dict[str, SliceInfo] = {}
    self.workers = 0
    self.code_hash = ''
    self._code: tuple[str, str] = ('', '')  # (archive, sha256).

  def prepare(self, nodes: tuple[str, ...]) -> None:
    """Describe, preflight, Python check, copy and set up `nodes`: nothing
    runs yet."""
    self.describe(nodes)
    self._preflight(nodes)
    self._check_firewall(nodes)
    for node in nodes:
      self._stop_if_interrupted()
      self._check_pythons(node)
    bundle, code_hash = self._bundle()
    short = code_hash[:16]
    self.say(f'copying the code (sha256 {code_hash}) to every worker of ' +
             ', '.join(nodes) + self._project_said())
    copies = [(bundle, f'podrun-{short}.tar.gz')]
    tls_job = self.job_id if self._authority().directory else ''
    if tls_job:
      copies.append((self._tls_archive(),
                     f'podrun-tls-{job_tls.uri_part(tls_job)}.tar.gz'))
    for node in nodes:
      for source, dest in copies:
        self._stop_if_interrupted()
        copy = self.gcloud.scp(source, dest, node)
        if commands.run_logged(copy, self.gcloud_log).returncode:
          raise LaunchError(
              f'gcloud scp to {node} failed; see {self.gcloud_log}. With an '
              'ssh-agent running, add the key gcloud uses: `ssh-add '
              '~/.ssh/google_compute_engine`.')
    self._set_up_workers(nodes, short, tls_job)
    self.code_hash = short

  def describe(self, nodes: tuple[str, ...]) -> None:
    """Reads `nodes` with describe; they must agree with every slice
    described before."""
    infos = {n: describe_slice(self.gcloud, n, self.gcloud_log) for n in nodes}
    check_slices_agree({**self.infos, **infos})
    self.infos.update(infos)
    first = infos[nodes[0]]
    self.workers = first.workers
    slices = (f'{len(nodes)} slices of ' if len(nodes) > 1 else '')
    self.say(f'TPU {self.options.tpu}: {slices}{first.accelerator_type}, '
             f'{self.workers} worker(s){" each" if slices else ""}')

  def _set_up_workers(self, nodes: tuple[str, ...], short: str,
                      tls_job: str) -> None:
    if self.options.worker_python:
      self.say('setting up every worker (unpacking the code; nothing is '
               f'installed: --worker_python={self.options.worker_python})')
    else:
      self.say('setting up every worker (the first time for this version: '
               'installs the project)')
    setup = commands.setup_command(short, self.options.worker_python,
                                   self._jax_version(), tls_job)
    for node in nodes:
      self._stop_if_interrupted()
      if commands.run_logged(
          self.gcloud.ssh(setup, node=node, workers=self.workers),
          self.gcloud_log).returncode:
        raise LaunchError(
            f'worker set-up on {node} failed; see {self.gcloud_log}')

  def _preflight(self, nodes: tuple[str, ...]) -> None:
    if self.options.skip_preflight:
      return
    for node in nodes:
      info = preflight_lib.check(node,
                                 self.options.zone,
                                 self.options.project,
                                 self.launcher_args,
                                 self.options.wait_healthy,
                                 log=self.say)
      self.say(f'preflight of {node}: {json.dumps(info.as_dict())}')

  def _check_firewall(self, nodes: tuple[str, ...]) -> None:
    """Names each port the job needs that no firewall rule opens to the
    workers (launcher/tpu/firewall.py); a warning, since a rule by tags or
    a hierarchical policy may open it where this cannot see."""
    info = self.infos[nodes[0]]
    if not info.first_address:
      return
    command = self.gcloud.firewall_rules()
    result = subprocess.run(command,
                            stdin=subprocess.DEVNULL,
                            capture_output=True,
                            text=True,
                            check=False)
    with open(self.gcloud_log, 'a') as log:
      log.write(f'$ {shlex.join(command)}\n{result.stdout}{result.stderr}')
    try:
      rules = [
          r for r in json.loads(result.stdout or '[]')
          if str(r.get('network', '')).rsplit('/', 1)[-1] == info.network
      ]
    except (ValueError, AttributeError):
      rules = None
    if result.returncode or rules is None:
      self.say(f'cannot read the firewall rules of network {info.network} '
               f'(see {self.gcloud_log}): the ports the job needs are not '
               'checked')
      return
    needed = firewall.ports_needed(self.options.num_slices,
                                   self.options.megascale_port)
    for port in firewall.missing(rules, needed, info.first_address):
      self.say(
          'warning: ' +
          firewall.advice(info.network, port, needed[port], info.first_address))

  def _project_said(self) -> str:
    project = self.project
    if not project or project.is_podrun:
      return ''
    return (f': podrun and the project {project.directory} '
            f'({len(project.files)} file(s), {project.size / 2**20:.1f} MiB)')

  def _tls_archive(self) -> str:
    """The authority as one file to copy, beside the code's archive."""
    path = os.path.join(os.path.dirname(self._bundle()[0]), 'tls.tar.gz')
    directory = self._authority().directory
    assert directory is not None, 'asked for only where the pod has TLS'
    if not os.path.exists(path):
      tls.archive(directory, path)
    return path

  def _bundle(self) -> tuple[str, str]:
    """(path, sha256) of the code archive, made once per launch: a slice
    recreated later gets the very code the others run, whatever changed in
    the working tree since (LOG_DIR holds only logs: the archive lives in
    a temporary directory of the launch's)."""
    if not self._code[0]:
      tmp = tempfile.mkdtemp(prefix='podrun_code_')
      weakref.finalize(self, shutil.rmtree, tmp, True)
      path = os.path.join(tmp, 'code.tar.gz')
      self._code = (path, bundle_lib.bundle(path, self.project))
    return self._code

  def _check_pythons(self, node: str) -> None:
    """Every worker has a Python for this JAX, or gets one, or we stop."""
    options, jax_version = self.options, self._jax_version()
    try:
      pythons = commands.check_pythons(self.gcloud, options.worker_python,
                                       self.gcloud_log, jax_version, node,
                                       self.workers)
    except LaunchError:
      if not options.provision_python:
        raise
      minimum = '.'.join(map(str, commands.required_python(jax_version)))
      self.say(f'installing Python {minimum} (for JAX {jax_version}) '
               'on the workers that lack it (--provision_python)')
      commands.run_logged(
          self.gcloud.ssh(commands.provision_command(options.worker_python,
                                                     jax_version),
                          node=node,
                          workers=self.workers), self.gcloud_log)
      pythons = commands.check_pythons(self.gcloud, options.worker_python,
                                       self.gcloud_log, jax_version, node,
                                       self.workers)
    self.say(f'worker Python on {node}: ' +
             ', '.join(f'worker {w}: {p}' for w, p in sorted(pythons.items())))
