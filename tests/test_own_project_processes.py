"""A user's own project, launched from its own directory outside the
checkout, trains on hosts that do not share this machine's disk: the
emulated TPU pod (its workers' homes are directories of their own, each
command run there in a fresh environment), with podrun run from its checkout
or installed from a wheel, and a local Ray cluster, each to the parameters
of a local run of the same project; and a project that cannot travel is
refused before anything is copied.
"""

import os
import shlex
import subprocess
import time
import tomllib

import pytest

from runtime.common import exit_codes
from tests import helpers
from tests import own_project
from tests import ray_cluster  # Before Ray: it keeps Ray on 127.0.0.1.
from tests import tpu_emulation

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

POD = ['--local_devices=4']


@pytest.fixture
def pod(tmp_path):
  fake = tpu_emulation.FakePod(tmp_path)
  yield fake
  leftovers = fake.processes()
  fake.kill_leftovers()
  assert not leftovers, f'processes left on the pod: {leftovers}'


@pytest.fixture(scope='module')
def local_run(tmp_path_factory):
  """The project trained on this machine, from its own directory: a local
  pod of the emulated pod's shape (2 processes of 4 devices)."""
  root = own_project.write(tmp_path_factory.mktemp('local') / 'my_project')
  workdir = root.parent / 'work'
  result = helpers.run_launcher([
      f'--config={own_project.CONFIG}', '--local_processes=2', *POD,
      f'--workdir={workdir}'
  ],
                                cwd=root,
                                timeout=120)
  assert result.returncode == 0, result.output
  return workdir


def _code_dirs(pod) -> list:
  return [
      sorted((pod.root / f'worker_{w}' / 'podrun').glob('code-*'))
      for w in range(pod.workers)
  ]


def test_a_project_of_ones_own_trains_on_every_worker(pod, tmp_path, local_run):
  root = own_project.write(tmp_path / 'my_project')
  workdir = tmp_path / 'work'
  result = pod.run('--',
                   f'--config={own_project.CONFIG}',
                   *POD,
                   f'--workdir={workdir}',
                   cwd=root)
  assert result.returncode == 0, result.output
  assert f'podrun and the project {root} (5 file(s)' in result.stderr
  assert f'step {own_project.STEPS}/{own_project.STEPS}' in pod.log(0)
  # Each worker ran the job from its own copy of the project, which holds
  # every file of it beside podrun's code.
  for dirs in _code_dirs(pod):
    code, = dirs
    assert sorted(p.name for p in code.iterdir()) == [
        '.podrun-ready', 'podrun', 'project'
    ]
    assert (code / 'project' / 'data' /
            'points.csv').read_bytes() == (root / 'data' /
                                           'points.csv').read_bytes()
  assert _code_dirs(pod)[0][0].name == _code_dirs(pod)[1][0].name
  assert helpers.fingerprints(workdir) == helpers.fingerprints(local_run)
  helpers.assert_trees_close(helpers.final_state(workdir)['params'],
                             helpers.final_state(local_run)['params'],
                             rtol=1e-6,
                             atol=1e-7)


@pytest.mark.parametrize('make, says', [
    (lambda root: (root / 'runtime').mkdir() or
     (root / 'runtime' / '__init__.py').write_text(''),
     'holds runtime/__init__.py, which on every host would be imported '
     "instead of podrun's own"),
    (lambda root: (root / 'data' / 'big.bin').write_bytes(b'x' * (3 << 20)),
     'over --project_max_mb=2; the biggest: data/big.bin (3.0 MiB)'),
])
def test_a_project_that_cannot_travel_exits_2_before_anything_runs(
    pod, tmp_path, make, says):
  root = own_project.write(tmp_path / 'my_project')
  make(root)
  result = pod.run('--project_max_mb=2',
                   '--',
                   f'--config={own_project.CONFIG}',
                   *POD,
                   cwd=root,
                   timeout=60)
  assert result.returncode == exit_codes.CONFIG_ERROR, result.output
  assert says in result.stderr
  assert 'Nothing was copied' in result.stderr
  assert not pod.calls.exists()  # No gcloud at all: nothing described.


def test_a_missing_project_dir_exits_2_naming_it(pod, tmp_path):
  result = pod.run(f'--project_dir={tmp_path / "nowhere"}',
                   '--',
                   f'--config={own_project.CONFIG}',
                   *POD,
                   timeout=60)
  assert result.returncode == exit_codes.CONFIG_ERROR, result.output
  assert f'--project_dir={tmp_path / "nowhere"}: no such directory' in (
      result.stderr)
  assert not pod.calls.exists()


def test_project_dir_names_the_project_from_anywhere(pod, tmp_path):
  root = own_project.write(tmp_path / 'my_project')
  result = subprocess.run(pod.args(f'--project_dir={root}', '--dry_run', '--',
                                   f'--config={own_project.CONFIG}', *POD),
                          cwd=tmp_path,
                          env=pod.env,
                          capture_output=True,
                          text=True,
                          timeout=60,
                          check=False)
  assert result.returncode == 0, result.stderr
  assert f'and the project {root} (5 file(s)' in result.stdout
  run = next(l for l in result.stdout.splitlines() if ' run test-job-a1 ' in l)
  command = shlex.split(run)[-1]
  assert '/project" && exec python3' in command
  assert not os.path.exists(pod.calls)


def _ran_from(output: str) -> set[str]:
  return {
      line.split('regress: running from ', 1)[1].strip()
      for line in output.splitlines()
      if 'regress: running from ' in line
  }


def test_on_ray_the_project_goes_to_every_node_as_its_working_dir(
    tmp_path, local_run):
  """About 20 s: a 2-node Ray cluster of its own, then the job."""
  pytest.importorskip('ray')
  subprocess.run(['git', 'init', '-q', str(tmp_path)], check=True)
  root = own_project.write(tmp_path / 'my_project')
  (root / '.gitignore').write_text('notes/\n')
  (root / 'notes').mkdir()
  (root / 'notes' / 'draft.txt').write_text('not for the cluster')
  workdir = tmp_path / 'work'
  with ray_cluster.RayCluster(nodes=2) as cluster:
    result = ray_cluster.run_podrun_ray(
        cluster.address,
        2, [
            f'--config={own_project.CONFIG}', *POD, f'--workdir={workdir}',
            '--log_all_ranks'
        ],
        cwd=root)
  assert result.returncode == 0, result.output
  assert f'the project {root} (6 file(s)' in result.stderr
  # Each process ran from Ray's copy of the project on its own node, not
  # from the project's own directory (on a real cluster, only this machine
  # has it), nor from the checkout.
  places = _ran_from(result.output)
  assert len(places) == 2, result.output
  for place in places:
    assert os.path.isfile(os.path.join(place, own_project.CONFIG))
    assert os.path.realpath(place) != os.path.realpath(root)
    assert not place.startswith(str(helpers.REPO))
    assert not os.path.exists(os.path.join(place, 'notes'))  # git ignores it
  assert helpers.fingerprints(workdir) == helpers.fingerprints(local_run)


def test_the_commands_podrun_s_messages_name_are_on_the_path(tmp_path):
  """About 20 s: a wheel built and installed into a fresh environment,
  whose bin/ must hold the commands the launcher's messages name."""
  venv = own_project.wheel_venv(tmp_path)
  scripts = tomllib.loads(
      (helpers.REPO / 'pyproject.toml').read_text())['project']['scripts']
  for command in ('podrun-goodput', 'podrun-fetch-mnist'):
    assert command in scripts
    result = subprocess.run([str(venv / 'bin' / command), '--help'],
                            cwd=tmp_path,
                            capture_output=True,
                            text=True,
                            timeout=120,
                            env=helpers.launcher_env(PYTHONPATH=''))
    assert result.returncode == 0, (command, result.stderr[-2000:])
    assert 'usage:' in result.stdout


def test_podrun_installed_from_a_wheel_ships_itself_and_the_project(
    pod, tmp_path, local_run):
  """About 20 s: a wheel built and installed into a fresh environment."""
  venv = own_project.wheel_venv(tmp_path)
  root = own_project.write(tmp_path / 'my_project')
  workdir = tmp_path / 'work'
  python = str(venv / 'bin' / 'python')
  env = dict(pod.env, PYTHONPATH='', PODRUN_LOCAL_PYTHON=python)
  where = subprocess.run(
      [python, '-c', 'import launcher; print(launcher.__file__)'],
      env=env,
      cwd=root,
      capture_output=True,
      text=True,
      check=True)
  assert where.stdout.startswith(str(venv)), where.stdout
  args = pod.args('--',
                  f'--config={own_project.CONFIG}',
                  *POD,
                  f'--workdir={workdir}',
                  python=python)
  started = time.monotonic()
  proc = subprocess.Popen(
      [str(venv / 'bin' / 'podrun-tpu'), 'launch', *args[1:]],
      cwd=root,
      env=env,
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True)
  try:
    result = helpers.finish(proc, 200, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 0, result.output
  code, = _code_dirs(pod)[0]
  podrun = code / 'podrun'
  # podrun's part is the installed packages and a pyproject.toml written
  # from the wheel's metadata, not the checkout's files.
  assert sorted(p.name for p in podrun.iterdir()) == [
      'configs', 'launcher', 'pyproject.toml', 'runtime'
  ]
  written = tomllib.loads((podrun / 'pyproject.toml').read_text())
  assert written['project']['name'] == 'podrun'
  assert 'jax[tpu]' in ' '.join(
      written['project']['optional-dependencies']['tpu'])
  assert (code / 'project' / own_project.CONFIG).exists()
  assert helpers.fingerprints(workdir) == helpers.fingerprints(local_run)
