"""Accelerator table, preflight against a fake TPU API, code bundle."""

import hashlib
import os
import subprocess
import sys
import tarfile
import tomllib

from packaging import requirements as requirements_lib
import pytest

from launcher.common import project
from launcher.tpu import bundle
from launcher.tpu import commands
from launcher.tpu import preflight
from launcher.tpu import tpu_api
from runtime.common import accelerators
from runtime.common import exit_codes
from tests import fake_tpu_api
from tests import helpers

pytestmark = pytest.mark.unit


@pytest.mark.parametrize('name, chips, hosts, devices_per_host', [
    ('v2-8', 4, 1, 8),
    ('v3-32', 16, 4, 8),
    ('v3-2048', 1024, 256, 8),
    ('v4-8', 4, 1, 4),
    ('v4-32', 16, 4, 4),
    ('v5p-8', 4, 1, 4),
    ('v5p-128', 64, 16, 4),
    ('v5litepod-1', 1, 1, 1),
    ('v5litepod-8', 8, 1, 8),
    ('v5litepod-16', 16, 4, 4),
    ('v5e-256', 256, 64, 4),
    ('v6e-8', 8, 1, 8),
    ('V6E-64', 64, 16, 4),
])
def test_slice_topology(name, chips, hosts, devices_per_host):
  t = accelerators.slice_topology(name)
  assert (t.chips, t.hosts, t.devices_per_host) == (chips, hosts,
                                                    devices_per_host)
  assert t.devices == hosts * devices_per_host


@pytest.mark.parametrize('name, message', [
    ('v4', 'is not GENERATION-SIZE'),
    ('v7x-8', "unknown generation 'v7x'; known: v2, v3, v4, v5p"),
    ('v3-16', 'v3 slices have 8, 32, 64, 128, 256, 512, 1024, 2048 cores, '
     'not 16'),
    ('v4-12', 'multiples of 8 from 8 to 4096 cores, not 12'),
    ('v6e-2', 'v6e slices have 1, 4, 8, 16, 32, 64, 128, 256 chips, not 2'),
])
def test_unknown_accelerator_types_say_what_exists(name, message):
  with pytest.raises(accelerators.AcceleratorTypeError, match=message):
    accelerators.slice_topology(name)


def node(state='READY', health='HEALTHY', accelerator_type='v4-16', workers=2):
  return {
      'state':
          state,
      'health':
          health,
      'acceleratorType':
          accelerator_type,
      'networkEndpoints': [{
          'ipAddress': f'10.0.0.{i}',
          'port': 8470
      } for i in range(workers)]
  }


@pytest.fixture
def api():
  with fake_tpu_api.FakeTpuApi() as server:
    yield server


def client(api, *answers, sleep=lambda s: None):
  """The pod my-pod through the fake API, which answers `answers` in turn."""
  api.queue('proj', 'us-central2-b', 'my-pod', *answers)
  return tpu_api.Node('my-pod',
                      'us-central2-b',
                      'proj',
                      api_root=api.root,
                      timeout_s=5,
                      sleep=sleep)


def run_preflight(c, expected=None, timeout_s=60):
  clock = [0.0]
  waits = []

  def sleep(s):
    waits.append(s)
    clock[0] += s

  info = preflight.preflight(c,
                             expected,
                             timeout_s,
                             interval_s=10,
                             sleep=sleep,
                             clock=lambda: clock[0],
                             log=lambda m: None)
  return info, waits


def test_healthy_pod_passes(api):
  c = client(api, node())
  info, waits = run_preflight(c, expected='v4-16')
  assert waits == []
  assert (info.accelerator_type, info.workers) == ('v4-16', 2)
  assert info.endpoints == ('10.0.0.0:8470', '10.0.0.1:8470')
  assert info.expected.devices_per_host == 4
  assert api.requests[0] == (
      '/v2/projects/proj/locations/us-central2-b/nodes/my-pod')


def test_unhealthy_then_healthy_waits(api):
  c = client(api, node(state='CREATING', health=None),
             node(state='CREATING', health=None),
             node(health='UNHEALTHY_MAINTENANCE'),
             node(health='UNHEALTHY_MAINTENANCE'), node())
  info, waits = run_preflight(c)
  assert waits == [10, 10] and info.health == 'HEALTHY'


def test_never_healthy_times_out_naming_state_and_health(api):
  with pytest.raises(
      preflight.PodUnavailableError,
      match='state=READY health=UNHEALTHY_TENSORFLOW after 30 s'):
    run_preflight(client(api, node(health='UNHEALTHY_TENSORFLOW')),
                  timeout_s=30)


@pytest.mark.parametrize('state', ['PREEMPTED', 'TERMINATED'])
def test_preempted_pod_fails_at_once_and_is_not_recoverable(api, state):
  c = client(api, node(state=state, health=None))
  with pytest.raises(preflight.PodUnavailableError,
                     match=f'my-pod is {state}: it will not come back'):
    run_preflight(c)
  ok, why = preflight.recoverable(c)
  assert not ok and f'state={state}' in why


def test_ready_pod_is_recoverable(api):
  assert preflight.recoverable(client(api, node()))[0]


def test_the_api_is_tried_again_on_429_and_5xx_and_gives_up_naming_it(api):
  waits = []
  c = client(api, 429, 503, node(), sleep=waits.append)
  assert c.state() == 'READY' and waits == [2.0, 4.0]
  busy = tpu_api.Node('other',
                      'us-central2-b',
                      'proj',
                      api_root=api.root,
                      timeout_s=5,
                      attempts=3,
                      sleep=lambda s: None)
  api.queue('proj', 'us-central2-b', 'other', 500)
  with pytest.raises(tpu_api.TpuApiError,
                     match=r'no answer after 3 tries; the last: HTTP 500'):
    busy.state()
  # A 404 (no such node) is not tried again.
  missing = tpu_api.Node('gone', 'z', 'proj', api_root=api.root, timeout_s=5)
  with pytest.raises(tpu_api.TpuApiError, match='HTTP 404'):
    missing.state()


def test_an_out_of_memory_symptom_is_not_recoverable(api):
  sick = dict(node(), symptoms=[{'symptomType': 'HBM_OUT_OF_MEMORY'}])
  assert not client(api, sick).recoverable()


def test_wrong_accelerator_type_names_both_sides(api):
  with pytest.raises(preflight.PodMismatchError) as e:
    run_preflight(client(api, node(accelerator_type='v4-32', workers=4)),
                  expected='v4-16')
  assert ('config.topology.accelerator_type expects v4-16, but TPU my-pod is '
          'v4-32') in str(e.value)
  assert 'Nothing was started' in str(e.value)


def test_wrong_worker_count_names_both_sides(api):
  with pytest.raises(preflight.PodMismatchError) as e:
    run_preflight(client(api, node(accelerator_type='v4-32', workers=3)))
  assert 'v4-32 has 4 host(s)' in str(e.value)
  assert 'lists 3 worker endpoint(s)' in str(e.value)


def test_both_problems_in_one_error(api):
  with pytest.raises(preflight.PodMismatchError, match='2 problem'):
    run_preflight(client(api, node(accelerator_type='v4-32', workers=3)),
                  expected='v5p-8')


def test_expected_type_comes_from_the_config_and_its_override(tmp_path):
  config = tmp_path / 'tpu_config.py'
  config.write_text('from configs import linear_regression\n'
                    'def get_config():\n'
                    '  c = linear_regression.get_config()\n'
                    '  c.topology.accelerator_type = "v4-16"\n'
                    '  return c\n')
  assert preflight.expected_accelerator_type([f'--config={config}']) == 'v4-16'
  assert preflight.expected_accelerator_type(
      [f'--config={config}',
       '--config.topology.accelerator_type=v4-32']) == 'v4-32'
  assert preflight.expected_accelerator_type(
      ['--config=configs/linear_regression.py']) is None


def _members(archive) -> dict:
  with tarfile.open(archive) as tar:
    return {m.name: m for m in tar.getmembers()}


def test_bundle_is_reproducible_and_honours_gitignore(tmp_path):
  repo = tmp_path / 'repo'
  repo.mkdir()
  subprocess.run(['git', 'init', '-q', str(repo)], check=True)
  (repo / '.gitignore').write_text('data/\n*.log\n')
  (repo / 'pyproject.toml').write_text('[project]\nname = "podrun"\n')
  (repo / 'a.py').write_text('print(1)\n')
  (repo / 'data').mkdir()
  (repo / 'data' / 'big.bin').write_bytes(b'x' * 100)
  (repo / 'run.log').write_text('noise')
  (repo / 'sub').mkdir()
  (repo / 'sub' / 'b.sh').write_text('echo hi\n')
  (repo / 'sub' / 'b.sh').chmod(0o755)
  first = bundle.bundle(str(tmp_path / 'one.tar.gz'), root=str(repo))
  second = bundle.bundle(str(tmp_path / 'two.tar.gz'), root=str(repo))
  assert first == second == hashlib.sha256(
      (tmp_path / 'one.tar.gz').read_bytes()).hexdigest()
  members = _members(tmp_path / 'one.tar.gz')
  assert sorted(members) == [
      'podrun/.gitignore', 'podrun/a.py', 'podrun/pyproject.toml',
      'podrun/sub/b.sh'
  ]
  assert members['podrun/sub/b.sh'].mode == 0o755
  (repo / 'a.py').write_text('print(2)\n')
  assert bundle.bundle(str(tmp_path / 'three.tar.gz'), root=str(repo)) != first


def test_the_bundle_carries_the_project_beside_podrun(tmp_path):
  own = tmp_path / 'my_project'
  (own / 'pkg').mkdir(parents=True)
  (own / 'my_config.py').write_text('x = 1\n')
  (own / 'pkg' / 'model.py').write_text('y = 2\n')
  found = project.find(str(own), podrun_root=project.podrun_root())
  code = bundle.bundle(str(tmp_path / 'code.tar.gz'), found)
  names = sorted(_members(tmp_path / 'code.tar.gz'))
  assert {'project/my_config.py', 'project/pkg/model.py'} < set(names)
  assert 'podrun/launcher/tpu/worker.py' in names
  assert not [n for n in names if not n.startswith(('podrun/', 'project/'))]
  assert bundle.run_directory(found) == 'project'
  # The hash names the project too.
  (own / 'my_config.py').write_text('x = 2\n')
  assert bundle.bundle(str(tmp_path / 'again.tar.gz'), found) != code
  # Launched from podrun's own checkout, the project is podrun's code.
  checkout = project.find(str(helpers.REPO), podrun_root=project.podrun_root())
  assert checkout.is_podrun and bundle.run_directory(checkout) == 'podrun'
  bundle.bundle(str(tmp_path / 'own.tar.gz'), checkout)
  assert not [
      n for n in _members(tmp_path / 'own.tar.gz') if n.startswith('project/')
  ]


def test_installed_without_a_checkout_the_packages_and_their_metadata_travel(
    tmp_path):
  # A root as pip leaves a wheel: the packages, no git, no pyproject.toml.
  site = tmp_path / 'site-packages'
  for package in ('launcher', 'runtime', 'configs'):
    (site / package / '__pycache__').mkdir(parents=True)
    (site / package / '__init__.py').write_text('')
    (site / package / '__pycache__' / 'x.cpython-311.pyc').write_bytes(b'')
  (site / 'other_package').mkdir()
  (site / 'other_package' / 'mod.py').write_text('')
  assert not project.is_checkout(str(site))
  bundle.bundle(str(tmp_path / 'code.tar.gz'), root=str(site))
  assert sorted(_members(tmp_path / 'code.tar.gz')) == [
      'podrun/configs/__init__.py', 'podrun/launcher/__init__.py',
      'podrun/pyproject.toml', 'podrun/runtime/__init__.py'
  ]


def test_installed_in_an_environment_a_repository_ignores_it_travels_whole(
    tmp_path):
  """A virtual environment inside the user's repository, which ignores it:
  git lists none of podrun's installed files, and all of them travel."""
  subprocess.run(['git', 'init', '-q', str(tmp_path)], check=True)
  (tmp_path / '.gitignore').write_text('.venv/\n')
  site = tmp_path / '.venv' / 'site-packages'
  for package in ('launcher', 'runtime', 'configs'):
    (site / package).mkdir(parents=True)
    (site / package / '__init__.py').write_text('')
  bundle.bundle(str(tmp_path / 'code.tar.gz'), root=str(site))
  assert sorted(_members(tmp_path / 'code.tar.gz')) == [
      'podrun/configs/__init__.py', 'podrun/launcher/__init__.py',
      'podrun/pyproject.toml', 'podrun/runtime/__init__.py'
  ]


def test_the_pyproject_written_from_metadata_asks_what_the_checkouts_does():
  written = tomllib.loads(bundle.installed_pyproject())
  own = tomllib.loads((helpers.REPO / 'pyproject.toml').read_text())

  def requirements(specs):
    return sorted((r.name, tuple(sorted(r.extras)), r.specifier)
                  for r in map(requirements_lib.Requirement, specs))

  assert written['project']['name'] == own['project']['name']
  assert written['project']['version'] == own['project']['version']
  assert written['project']['requires-python'] == own['project'][
      'requires-python']
  assert requirements(written['project']['dependencies']) == requirements(
      own['project']['dependencies'])
  extras = own['project']['optional-dependencies']
  assert sorted(written['project']['optional-dependencies']) == sorted(extras)
  for name, specs in extras.items():
    assert requirements(written['project']['optional-dependencies'][name]) == (
        requirements(specs)), name


def test_cli_preflight_exit_codes_without_a_reachable_api(tmp_path):
  # No credentials and no network here: the client cannot read the pod, and
  # the helper says so with POD_UNAVAILABLE rather than a traceback.
  result = subprocess.run([
      sys.executable, '-m', 'launcher.tpu', 'preflight', '--tpu=x', '--zone=z',
      '--project=p', '--wait_healthy=0', '--',
      '--config=configs/linear_regression.py'
  ],
                          cwd=helpers.REPO,
                          capture_output=True,
                          text=True,
                          timeout=120,
                          env=helpers.launcher_env(
                              GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path /
                                                                 'none.json'),
                              TPU_API_DISCOVERY_URL='http://127.0.0.1:9/'))
  assert result.returncode == exit_codes.POD_UNAVAILABLE, result.stderr
  assert 'tpu_pod: error:' in result.stderr
  assert 'Traceback' not in result.stderr


def test_missing_application_default_credentials_say_what_to_run():

  class DefaultCredentialsError(Exception):
    pass

  message = preflight.explain_api_error(
      'my-pod',
      DefaultCredentialsError('Could not automatically determine '
                              'credentials.'))
  assert 'Run `gcloud auth application-default login`' in message
  assert 'my-pod' in message


@pytest.mark.parametrize('jax_version, python', [('0.10.2', (3, 11)),
                                                 ('0.11.0', (3, 12)),
                                                 ('0.12.0.1', (3, 12))])
def test_the_worker_python_follows_the_jax_release(jax_version, python):
  assert commands.required_python(jax_version) == python
  assert f'>= ({python[0]}, {python[1]})' in commands.find_python('', python)
  assert (f'install -y -q python{python[0]}.{python[1]} '
          f'python{python[0]}.{python[1]}-venv') in commands.provision_command(
              '', jax_version)


def test_every_worker_installs_the_drivers_jax():
  setup = commands.setup_command('abc', '', '0.12.0.1')
  assert "'jax[tpu]==0.12.0.1'" in setup
  # With the interpreter the Python check found, which needs 3.12 for it.
  assert f'py="$(cat "{commands.FOUND_PYTHON}")"' in setup
  check = commands.PYTHON_PROBE.replace(
      'FIND', commands.find_python('', commands.required_python('0.12.0.1')))
  assert '>= (3, 12)' in check
  assert f'> "{commands.FOUND_PYTHON}"' in check


def test_without_the_pod_extra_the_preflight_says_what_to_install(tmp_path):
  # A stand-in module that fails to import as a missing package does.
  (tmp_path / 'requests.py').write_text(
      "raise ImportError('No module named requests', name='requests')\n")
  env = helpers.launcher_env()
  env['PYTHONPATH'] = f'{tmp_path}{os.pathsep}{env["PYTHONPATH"]}'
  result = subprocess.run([
      sys.executable, '-m', 'launcher.tpu', 'preflight', '--tpu=x', '--zone=z',
      '--wait_healthy=0', '--', '--config=configs/linear_regression.py'
  ],
                          cwd=helpers.REPO,
                          capture_output=True,
                          text=True,
                          timeout=120,
                          env=env)
  assert result.returncode == exit_codes.CONFIG_ERROR, result.stderr
  assert 'pip install -e ".[pod]"' in result.stderr
  assert '--skip_preflight' in result.stderr
  assert 'Traceback' not in result.stderr


def test_every_flag_of_the_launch_is_helped_and_in_the_scripts_header():
  from launcher.tpu import flags  # pylint: disable=g-import-not-at-top
  actions = [
      a for a in flags._parser()._actions  # pylint: disable=protected-access
      if a.option_strings != ['-h', '--help']
  ]
  assert not [a.dest for a in actions if not a.help]
  shown = subprocess.run(
      ['bash',
       str(helpers.REPO / 'scripts' / 'launch_tpu_pod.sh'), '--help'],
      capture_output=True,
      text=True,
      timeout=30,
      check=True).stdout
  missing = [
      a.option_strings[0] for a in actions if a.option_strings[0] not in shown
  ]
  assert not missing, f'the script\'s --help lacks {missing}'
  # The whole header, to its last sentence.
  assert shown.rstrip().endswith('(or --config.checkpointing=False).')


def test_podrun_tpu_help_lists_its_commands():
  shown = subprocess.run([sys.executable, '-m', 'launcher.tpu', '--help'],
                         capture_output=True,
                         text=True,
                         timeout=60,
                         cwd=helpers.REPO,
                         check=True).stdout
  for command in ('launch', 'preflight', 'recoverable', 'bundle'):
    assert f'    {command}' in shown, shown
