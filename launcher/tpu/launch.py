"""What one TPU launch knows: its slices, its job, its commands, its logs
and the signals it got.

`Launch` is what the driver (driver.py), an attempt (attempt.py: its
`Context`) and the slices (slices.py, elastic.py: a babysit.Owner) hold of
a launch; each reads only its own part.

Example:
  >>> options, launcher_args = flags.parse(argv, launcher_args)
  >>> launch = Launch(options, launcher_args, project)
  >>> launch.prepare()            # describe, check, copy, set up
  >>> launch.run_command(attempt=1, slice_id=0)
  'cd "$HOME/podrun/code-3f2a/project" && exec python3 ... run ...'
"""

import functools
import os
import sys
import threading
import time
import weakref
from typing import Optional

from launcher import tls
from launcher.common import flag_values
from launcher.common import project as project_lib
from launcher.tpu import bundle
from launcher.tpu import commands
from launcher.tpu import flags
from launcher.tpu import queued
from launcher.tpu import setup as setup_lib
from launcher.tpu import slices as slices_lib
from runtime.common import handoff


class Launch:
  """Everything one launch knows: the slices, the job, the commands, the
  logs, and the signals it got."""

  def __init__(self,
               options: flags.PodFlags,
               launcher_args: flag_values.LaunchArgs,
               project: Optional[project_lib.Project] = None):
    self.options = options
    # What travels besides podrun's code (None: --stop, --status).
    self.project = project
    self.launcher_args = launcher_args
    self.gcloud = commands.Gcloud(options.tpu, options.zone, options.project)
    self.job_id = options.job_id or (
        f'podrun-{time.strftime("%Y%m%d-%H%M%S", time.gmtime())}-{os.getpid()}')
    self.log_dir = os.path.abspath(options.log_dir or
                                   os.path.join('tpu_logs', self.job_id))
    self.all_nodes = queued.node_names(options.tpu, options.num_slices)
    self.coordinator = ''
    self.setup = setup_lib.SliceSetup(self.gcloud, options, launcher_args,
                                      self.job_id, self.say,
                                      self.path('gcloud.log'),
                                      self.stop_if_interrupted,
                                      lambda: self.jax_version,
                                      lambda: self.authority, project)
    self.signals: list[int] = []
    self.slices: slices_lib.Slices = slices_lib.of(self)
    self._log_lock = threading.Lock()

  @property
  def workers(self) -> int:
    """Workers per slice, once described (0 before)."""
    return self.setup.workers

  @property
  def infos(self) -> dict[str, setup_lib.SliceInfo]:
    return self.setup.infos

  @property
  def nodes(self) -> tuple[str, ...]:
    """The slices the job runs on: every one, or an elastic job's now."""
    return self.slices.nodes()

  @functools.cached_property
  def jax_version(self) -> str:
    """The JAX every worker installs: this environment's, on a Python it
    runs on (--provision_python installs one where needed)."""
    return commands.worker_jax_version()

  def on_signal(self, signum, frame) -> None:
    del frame
    self.signals.append(signum)

  def interrupted(self) -> bool:
    return bool(self.signals)

  def stop_if_interrupted(self) -> None:
    """Between the set-up's steps: a signal ends the launch there."""
    if self.signals:
      raise queued.Interrupted()

  def path(self, name: str) -> str:
    return os.path.join(self.log_dir, name)

  def write(self, name: str, line: str) -> None:
    with self._log_lock, open(self.path(name), 'a') as f:
      f.write(line + '\n')

  def say(self, message: str) -> None:
    print(f'launch_tpu_pod: {message}', file=sys.stderr, flush=True)

  def prepare(self, nodes: Optional[tuple[str, ...]] = None) -> None:
    """Describe, preflight, Python check, copy and set up `nodes` (default
    the job's): nothing runs yet. Again after a slice is recreated: its VMs
    start with empty disks."""
    self.setup.prepare(nodes or self.nodes)

  @functools.cached_property
  def authority(self) -> tls.PodAuthority:
    """The launch's certificate authority for mutual TLS on the job's
    coordinator (launcher/tls.py), where --tls and the workers' JAX allow;
    removed from this machine with the launch."""
    authority = tls.PodAuthority(self.launcher_args.tls, self.job_id, self.say,
                                 self.jax_version)
    weakref.finalize(self, authority.close)
    return authority

  def place(self, slice_id: int) -> commands.SlicePlace:
    """Slice `slice_id` of the job's; the first holds the coordinator."""
    first = self.infos.get(self.nodes[0])
    return commands.SlicePlace(
        slice_id, len(self.nodes),
        first.first_address if first else self.coordinator,
        self.options.megascale_port)

  def told(self) -> handoff.Handoff:
    """What every attempt tells each process, before its job id and
    attempt (commands.run_command)."""
    # Every count of slices from --min_slices up: refused before step 1
    # when the config cannot run on one of them.
    elastic = ((self.options.min_slices * self.workers,
                self.options.num_slices *
                self.workers) if self.options.min_slices and
               isinstance(self.workers, int) else None)
    return handoff.Handoff(elastic=elastic,
                           elastic_slices=elastic is not None,
                           tls_dir=(commands.tls_dir(self.job_id)
                                    if self.authority.directory else None))

  def run_command(self, attempt: int, slice_id: int = 0) -> str:
    return commands.run_command(self.setup.code_hash, self.job_id,
                                self.options.worker_python, self.told(),
                                list(self.options.env), self.launcher_args,
                                self.workers, self.options, attempt,
                                self.place(slice_id),
                                bundle.run_directory(self.project))
