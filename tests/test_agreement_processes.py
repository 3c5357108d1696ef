"""Processes that differ (code, config, rank) stop before step 1: real pods
and processes started by hand."""

import shutil

import pytest

from runtime.common import exit_codes
from tests import cluster
from tests import helpers

pytestmark = pytest.mark.processes

PROBE = [
    f'--config={helpers.PROBE_CONFIG}', '--config.steps=1000000',
    '--config.checkpointing=False'
]


def _copy_of_the_repository(tmp_path):
  """Another checkout whose runtime/step.py differs by a comment."""
  copy = tmp_path / 'other_checkout'
  for package in ('launcher', 'runtime', 'configs', 'tests'):
    shutil.copytree(helpers.REPO / package,
                    copy / package,
                    ignore=shutil.ignore_patterns('__pycache__'))
  with open(copy / 'runtime' / 'step.py', 'a') as f:
    f.write('# a stale checkout\n')
  return copy


def _fake_version(tmp_path, package='optax', version='9.9.9'):
  """A directory whose metadata claims another version of `package`."""
  site = tmp_path / 'fake_site'
  info = site / f'{package}-{version}.dist-info'
  info.mkdir(parents=True)
  (info / 'METADATA'
  ).write_text(f'Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n')
  return f'{site}:{helpers.REPO}'


_INJECTIONS = {
    'config': (dict(rank_args={1: ['--config.optimizer.learning_rate=0.5']}),
               'config.optimizer.learning_rate: rank 0 0.1, rank 1 0.5'),
    'xla_flag':
        (dict(rank_env={1: {
            'XLA_FLAGS': '--xla_backend_optimization_level=2'
        }}), 'env.XLA_FLAGS: rank 0 (unset), rank 1 '
         '--xla_backend_optimization_level=2'),
    'version': (None, 'version.optax: rank 0 '),
    'code': (None, 'code.podrun: rank 0 '),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize('what', sorted(_INJECTIONS))
def test_processes_started_by_hand_that_differ_stop_before_step_1(
    tmp_path, what):
  injection, expected = _INJECTIONS[what]
  if what == 'version':
    injection = dict(rank_env={1: {'PYTHONPATH': _fake_version(tmp_path)}})
    expected_other = 'rank 1 9.9.9'
  elif what == 'code':
    injection = dict(rank_cwd={1: _copy_of_the_repository(tmp_path)})
    expected_other = ', rank 1 '
  else:
    expected_other = ''
  with cluster.Cluster(tmp_path / 'work', 2, PROBE, **injection) as job:
    exits = job.wait(timeout=120)
  for rank, exit_ in exits.items():
    assert exit_.code == exit_codes.TOPOLOGY_MISMATCH, exit_.output
    assert expected in exit_.output and expected_other in exit_.output, (
        exit_.output)
    assert 'step 1/' not in exit_.output
  assert not (tmp_path / 'work' / 'metrics.jsonl').exists()


@pytest.mark.timeout(180)
def test_a_local_pod_whose_config_differs_by_rank_stops_before_step_1(tmp_path):
  result = helpers.run_launcher([
      '--config=tests/workloads/rank_dependent_config.py',
      f'--workdir={tmp_path}', '--local_processes=2'
  ])
  assert result.returncode == exit_codes.TOPOLOGY_MISMATCH, result.output
  assert 'config.optimizer.learning_rate: rank 0 0.1, rank 1 0.5' in (
      result.stderr)
  assert not (tmp_path / 'metrics.jsonl').exists()
  assert helpers.wait_for(lambda: not helpers.job_processes(tmp_path), 10)


def _rank_1_differs(tmp_path, what: str) -> str:
  """A PYTHONPATH whose sitecustomize changes rank 1 of a local pod alone:
  the launcher gives every rank the same command and environment, so the
  difference has to come from inside the rank's own interpreter."""
  site = tmp_path / 'rank_1_site'
  site.mkdir()
  change = {
      'xla_flag':
          "os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')"
          " + ' --xla_backend_optimization_level=2')",
      'version':
          f"sys.path.insert(0, {_fake_version(tmp_path).split(':')[0]!r})",
      # Site runs before `-m` puts the working directory first on sys.path:
      # rank 1 then imports another checkout.
      'code':
          f'os.chdir({str(_copy_of_the_repository(tmp_path))!r})',
  }[what]
  (site / 'sitecustomize.py').write_text(
      'import os, sys\n'
      f"if '--process_id=1' in sys.argv:\n  {change}\n")
  return f'{site}:{helpers.REPO}'


@pytest.mark.timeout(180)
@pytest.mark.parametrize('what, expected', [
    ('xla_flag', 'env.XLA_FLAGS: rank 0 '),
    ('version', 'version.optax: rank 0 '),
    ('code', 'code.podrun: rank 0 '),
])
def test_a_local_pod_whose_rank_differs_stops_before_step_1(
    tmp_path, what, expected):
  result = helpers.run_launcher(
      [
          f'--config={helpers.PROBE_CONFIG}', f'--workdir={tmp_path / "work"}',
          '--local_processes=2', '--config.steps=1000000'
      ],
      env=helpers.launcher_env(PYTHONPATH=_rank_1_differs(tmp_path, what)))
  assert result.returncode == exit_codes.TOPOLOGY_MISMATCH, result.output
  line = helpers.first_line_with(result.stderr, expected)
  assert line and {
      'xla_flag': 'xla_backend_optimization_level=2',
      'version': 'rank 1 9.9.9',
      'code': ', rank 1 '
  }[what] in line, result.stderr
  assert not (tmp_path / 'work' / 'metrics.jsonl').exists()
  assert helpers.wait_for(lambda: not helpers.job_processes(tmp_path / 'work'),
                          10)
