"""A Cloud TPU emulated on this machine, for the pod driver's tests.

tests/fake_gcloud/gcloud stands in for gcloud (see its docstring and
cloud.py's): each worker is a directory that serves as its home and a local
process per ssh call; the workers meet on 127.0.0.1.
"""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

from launcher.tpu import commands
from tests import helpers

SCRIPT = str(helpers.REPO / 'scripts' / 'launch_tpu_pod.sh')
FAKE_BIN = helpers.REPO / 'tests' / 'fake_gcloud'
# What --provision_python installs for this environment's JAX: python3.11
# for JAX 0.10, python3.12 from JAX 0.11 on.
WORKER_PYTHON = 'python' + '.'.join(
    map(str, commands.required_python(commands.worker_jax_version())))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


# A light stand-in for the job (see its header): `python=STANDIN` and
# `--standin.steps=N` after `--`.
STANDIN = str(FAKE_BIN / 'standin_job')


def ubuntu_2204_path(tmp_path) -> str:
  """A worker PATH as on Ubuntu 22.04: python3 says 3.10, no python3.X, and
  sudo, add-apt-repository and apt-get that install python3.X the way the
  deadsnakes PPA would (here: a script that runs this interpreter)."""
  bin_dir, tools = tmp_path / 'ubuntu_bin', tmp_path / 'ubuntu_tools'
  bin_dir.mkdir()
  tools.mkdir()
  for tool in ('bash', 'sh', 'tar', 'gzip', 'mkdir', 'cp', 'touch', 'rm', 'cat',
               'ln', 'sed', 'grep', 'cut', 'sha256sum', 'env', 'chmod'):
    found = shutil.which(tool)
    if found:
      (tools / tool).symlink_to(found)
  scripts = {
      # Says 3.10 to the Python check, runs tpu_worker.py all the same.
      'python3': f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo 3.10; exit 0; '
                 f'fi\nexec {sys.executable} "$@"\n',
      'sudo': '#!/bin/sh\nexec env "$@"\n',
      'add-apt-repository': '#!/bin/sh\necho "$*" >> "$HOME/apt.log"\n',
      'apt-get': f'#!/bin/sh\necho "$*" >> "$HOME/apt.log"\ncase "$*" in '
                 f'*"install"*{WORKER_PYTHON}*) printf \'#!/bin/sh\\nexec %s '
                 f'"$@"\\n\' {sys.executable} > {bin_dir}/{WORKER_PYTHON}; '
                 f'chmod +x {bin_dir}/{WORKER_PYTHON} ;; esac\n',
  }
  for name, text in scripts.items():
    (bin_dir / name).write_text(text)
    (bin_dir / name).chmod(0o755)
  return f'{bin_dir}:{tools}'


class FakePod:
  """The environment and paths of one emulated pod."""

  def __init__(self, tmp_path: pathlib.Path, workers: int = 2, **env):
    self.root = tmp_path / 'pod'
    self.logs = tmp_path / 'logs'
    self.calls = tmp_path / 'gcloud_calls.jsonl'
    self.workers = workers
    # The fake gcloud is `#!/usr/bin/env python3`, run hundreds of times a
    # test: this interpreter's directory first, not a version manager's
    # shim that finds one each time (pyenv's: about 10 times the start).
    # `env` may override any of these (the pod's name and type, say).
    self.env = helpers.launcher_env(
        **{
            'PATH':
                os.pathsep.join([
                    str(FAKE_BIN),
                    os.path.dirname(sys.executable), os.environ['PATH']
                ]),
            'FAKE_TPU_POD_ROOT':
                str(self.root),
            'FAKE_TPU_WORKERS':
                str(workers),
            'FAKE_TPU_NAME':
                'fake-pod',
            'FAKE_TPU_ACCELERATOR_TYPE':
                f'v4-{8 * workers}',
            'FAKE_TPU_COORDINATOR_PORT':
                str(_free_port()),
            'FAKE_TPU_WORKER_PATH':
                f'{os.path.dirname(sys.executable)}:/usr/bin:/bin',
            'FAKE_GCLOUD_CALLS':
                str(self.calls),
            'FAKE_GCLOUD_RETRY_S':
                '1',
            'PODRUN_LOCAL_PYTHON':
                sys.executable,
            **env
        })

  def args(self,
           *script_args,
           job_id='test-job',
           python=sys.executable,
           tpu='fake-pod'):
    return [
        SCRIPT, f'--tpu={tpu}', '--zone=zone-a', '--project=proj',
        '--skip_preflight', f'--worker_python={python}',
        f'--log_dir={self.logs}', f'--job_id={job_id}', '--stop_grace=5',
        *script_args
    ]

  def start(self, *script_args, cwd=helpers.REPO, **kwargs) -> subprocess.Popen:
    """The script, run from `cwd` (the project that travels)."""
    return subprocess.Popen(self.args(*script_args, **kwargs),
                            cwd=cwd,
                            env=self.env,
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            text=True,
                            start_new_session=True)

  def run(self, *script_args, timeout=200, **kwargs) -> helpers.Result:
    started = time.monotonic()
    proc = self.start(*script_args, **kwargs)
    try:
      return helpers.finish(proc, timeout, started)
    finally:
      helpers.kill_group(proc)

  def processes(self) -> list[int]:
    """Live processes on the pod's workers (their environment names it)."""
    return helpers.processes_with_env(f'FAKE_TPU_POD_ROOT={self.root}')

  def kill_leftovers(self) -> None:
    for pid in self.processes():
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass

  def log(self, worker: int) -> str:
    return (self.logs / f'worker_{worker}.log').read_text()

  def job_log(self, worker: int, job_id: str = 'test-job-a1') -> str:
    """What the job itself wrote on the worker."""
    return (self.root / f'worker_{worker}' / 'podrun' / 'jobs' / job_id /
            'log').read_text()

  def gcloud_calls(self) -> list[list[str]]:
    return [json.loads(l) for l in self.calls.read_text().splitlines()]

  def gcloud(self, *args: str) -> subprocess.CompletedProcess:
    """Runs the fake gcloud as a user would, outside any launch."""
    return subprocess.run([str(FAKE_BIN / 'gcloud'), *args],
                          env=dict(self.env, FAKE_GCLOUD_CALLS=''),
                          capture_output=True,
                          text=True,
                          timeout=60,
                          check=False)

  def queued_resources(self) -> list[dict]:
    """The queued resources the emulated service holds now."""
    listed = self.gcloud('compute', 'tpus', 'queued-resources', 'list',
                         '--zone=zone-a', '--format=json')
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)

  def states_shown(self, name: str) -> list[str]:
    """The states the service's describes of `name` answered, each once,
    in the order they were first shown."""
    path = self.root / '.cloud' / 'answers.jsonl'
    shown = []
    for line in path.read_text().splitlines() if path.exists() else []:
      answer = json.loads(line)
      if answer['name'] == name and answer['state'] not in shown:
        shown.append(answer['state'])
    return shown

  def events(self) -> list[dict]:
    """What the service did: created, preempted, delete, deleted."""
    path = self.root / '.cloud' / 'events.jsonl'
    if not path.exists():
      return []
    return [json.loads(l) for l in path.read_text().splitlines()]
