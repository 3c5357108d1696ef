"""Running the launcher in a subprocess from a test, and cleaning up after it.

Every process a test starts gets its own process group and a timeout; on
timeout or failure the whole group is killed by its id.
"""

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
PROBE_CONFIG = 'tests/workloads/probe_config.py'
# The steps of the uninterrupted probe run (conftest's probe_2x4_straight).
STRAIGHT_STEPS = 60

# Where the Cloud Storage and metadata clients of a process a test starts
# go unless the test's emulator says otherwise: a loopback port that
# refuses at once, so that nothing a test starts reaches Google.
NOWHERE = 'http://127.0.0.1:9'
NO_CLOUD = {
    'STORAGE_EMULATOR_HOST': NOWHERE,
    'TENSORSTORE_GCS_HTTP_URL': NOWHERE,
    'NO_GCE_CHECK': 'True',
    'GCE_METADATA_HOST': '127.0.0.1:9',
    'GCE_METADATA_IP': '127.0.0.1:9',
    'GCE_METADATA_ROOT': '127.0.0.1:9'
}


def launcher_env(**extra: str) -> dict[str, str]:
  """The environment a user's shell would give the launcher: no test
  XLA_FLAGS, and no way to Google's servers (NO_CLOUD)."""
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')
  }
  for name, value in NO_CLOUD.items():
    env.setdefault(name, value)
  env['PYTHONPATH'] = os.pathsep.join(
      [str(REPO)] +
      [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
  env.update(extra)
  return env


@dataclasses.dataclass
class Result:
  returncode: int
  stdout: str
  stderr: str
  elapsed: float

  @property
  def output(self) -> str:
    return self.stdout + self.stderr


def start_launcher(args: list[str], cwd=REPO, env=None) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, '-m', 'launcher', *args],
                          cwd=cwd,
                          env=env or launcher_env(),
                          stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          text=True,
                          start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def finish(proc: subprocess.Popen, timeout: float, started: float) -> Result:
  """Waits for a started launcher; kills its group and fails on timeout."""
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    kill_group(proc)
    out, err = proc.communicate()
    raise AssertionError(f'the launcher ran past {timeout} s; its output:\n'
                         f'{out[-3000:]}\n{err[-3000:]}') from None
  return Result(proc.returncode, out, err, time.monotonic() - started)


def run_launcher(args: list[str],
                 timeout: float = 120,
                 cwd=REPO,
                 env=None) -> Result:
  """Runs `python -m launcher ARGS` to the end (or the timeout)."""
  started = time.monotonic()
  return finish(start_launcher(args, cwd, env), timeout, started)


def read_json(path) -> dict:
  with open(path) as f:
    return json.load(f)


def read_jsonl(path) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f]


def job_processes(workdir) -> list[int]:
  """Pids of live processes that belong to the local pod run in `workdir`.

  A rank and anything it started carry the job's id in their environment.
  """
  job_id = read_json(pathlib.Path(workdir) / 'logs' / 'job.json')['job_id']
  return processes_with_env(f'PODRUN_JOB_ID={job_id}')


def processes_with_env(entry: str) -> list[int]:
  """Pids of live processes (not this one) whose environment holds `entry`."""
  marker = entry.encode()
  alive = []
  for pid in os.listdir('/proc'):
    if not pid.isdigit() or int(pid) == os.getpid():
      continue
    try:
      with open(f'/proc/{pid}/environ', 'rb') as f:
        if marker in f.read().split(b'\0'):
          alive.append(int(pid))
    except OSError:
      continue
  return alive


def wait_for(predicate, timeout: float, interval: float = 0.1) -> bool:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return True
    time.sleep(interval)
  return predicate()


def rank_pids(workdir) -> dict[int, int]:
  job = read_json(pathlib.Path(workdir) / 'logs' / 'job.json')
  return {r['rank']: r['pid'] for r in job['ranks']}


def first_line_with(text: str, needle: str) -> Optional[str]:
  return next((l for l in text.splitlines() if needle in l), None)


def run_then_sigkill(code: str) -> None:
  """Runs Python `code` in a child that then SIGKILLs itself, as the OOM
  killer would, and checks that it died so."""
  child = subprocess.run(
      [sys.executable, '-c', code + '\nos.kill(os.getpid(), 9)\n'],
      cwd=REPO,
      env=launcher_env(),
      timeout=60,
      check=False)
  assert child.returncode == -signal.SIGKILL, child.returncode


def assert_no_survivors(workdir) -> None:
  """Every process of the job in `workdir` has gone (the kernel gets a
  moment to reap the group after the launcher exits)."""
  assert wait_for(lambda: not job_processes(workdir),
                  10), (job_processes(workdir))


def fingerprints(workdir, ranks: int = 2) -> list[str]:
  """The sha256 of each rank's final parameters, from ranks/rank_<i>.json."""
  return [
      read_json(pathlib.Path(workdir) / 'ranks' /
                f'rank_{i}.json')['fingerprint']['sha256'] for i in range(ranks)
  ]


def final_state(workdir) -> dict:
  """The newest persistent checkpoint's TrainState as nested numpy dicts
  ({'params', 'model_state', 'opt_state', 'rng'}), for comparing arrays."""
  from runtime.checkpoints import checkpoint  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(workdir) / 'checkpoints'
  newest = max((p for p in root.iterdir() if p.name.isdigit()),
               key=lambda p: int(p.name))
  return checkpoint.read_state(str(newest))._asdict()


def assert_trees_close(one, two, rtol: float, atol: float) -> None:
  """Every array of `one` equals its counterpart in `two` within rtol/atol:
  sign, order and place, not only a sum."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  assert (jax.tree_util.tree_structure(one) == jax.tree_util.tree_structure(two)
         ), (one, two)
  for path, a in jax.tree_util.tree_flatten_with_path(one)[0]:
    b = two
    for key in path:
      b = b[key.key]
    np.testing.assert_allclose(np.asarray(a),
                               np.asarray(b),
                               rtol=rtol,
                               atol=atol,
                               err_msg=jax.tree_util.keystr(path))
