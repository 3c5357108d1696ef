"""What `podrun-ray` was asked: its flags, read once (__main__.parse).

Example:
  >>> RayFlags(address='auto', num_processes=4,
  ...         resources_per_process={'GPU': 8},
  ...         launcher_args=flag_values.LaunchArgs([
  ...             '--config=configs/mnist.py',
  ...             '--workdir=/shared/runs/mnist'])).min_processes
  None
"""

import dataclasses
from typing import Optional

from launcher import restart
from launcher.common import flag_values
from launcher.common import project as project_lib


@dataclasses.dataclass(frozen=True)
class RayFlags:
  """What `podrun-ray` was asked.

  Attributes:
    address: the Ray cluster ('auto', or the head's HOST:PORT).
    num_processes: one per node.
    resources_per_process: one bundle, e.g. {'GPU': 8} or {'TPU': 4}.
    launcher_args: the launcher's flags, as for `podrun`, read once.
    start_timeout_s: how long to wait for Ray to place every bundle.
    stop_grace_s: after a process failed, how long the others have to end
      on their own (their supervisors see the failure) before they are
      stopped; also SIGTERM's grace before SIGKILL.
    restarts: --max_restarts, --restart_backoff and --retry_exit_codes,
      as every launcher restarts a job (launcher/restart.py).
    min_processes: the fewest processes an elastic job runs on
      (launcher/ray/elastic.py); None: always num_processes.
    project_dir, project_max_mb: the project that travels to every node
      (launcher/common/project.py); '' for the current directory.
    env: the user's variables for every process (--env KEY=VALUE).
  """
  address: str
  num_processes: int
  resources_per_process: dict[str, float]
  launcher_args: flag_values.LaunchArgs
  start_timeout_s: float = 120.0
  stop_grace_s: float = 30.0
  restarts: restart.RestartPolicy = restart.RestartPolicy()
  min_processes: Optional[int] = None
  project_dir: str = ''
  project_max_mb: float = project_lib.DEFAULT_MAX_MB
  env: dict[str, str] = dataclasses.field(default_factory=dict)
