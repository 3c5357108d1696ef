"""`python -m launcher` end to end, in a subprocess, as a user runs it."""

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]

LINEAR = 'configs/linear_regression.py'


def _one_error_line(result: helpers.Result) -> str:
  assert 'Traceback' not in result.stderr, result.stderr
  lines = [l for l in result.stderr.splitlines() if 'error' in l.lower()]
  assert len(lines) == 1, result.stderr
  return lines[0]


def test_default_job_learns_the_true_weights(tmp_path):
  result = helpers.run_launcher([f'--config={LINEAR}', f'--workdir={tmp_path}'])
  assert result.returncode == 0, result.output
  summary = helpers.read_json(tmp_path / 'summary.json')
  assert summary['device_count'] == 8 and summary['process_count'] == 1
  assert summary['steps'] == 200 and summary['global_batch_size'] == 256
  res = summary['results']
  np.testing.assert_allclose(res['learned_weight'],
                             res['true_weight'],
                             atol=0.02)
  assert abs(res['learned_bias'] - res['true_bias']) < 0.02
  assert summary['final_metrics']['loss'] < 0.02  # noise_std**2 = 0.01
  rank = helpers.read_json(tmp_path / 'ranks' / 'rank_0.json')
  assert rank['fingerprint'] == res['fingerprint']
  assert 'topology: process 0 of 1, 8 local x 1 processes' in result.stderr


def test_overrides_and_local_devices(tmp_path):
  result = helpers.run_launcher([
      f'--config={LINEAR}', f'--workdir={tmp_path}', '--config.steps=7',
      '--config.global_batch_size=64', '--config.log_every=7',
      '--local_devices=4'
  ])
  assert result.returncode == 0, result.output
  summary = helpers.read_json(tmp_path / 'summary.json')
  assert (summary['steps'], summary['global_batch_size'],
          summary['device_count']) == (7, 64, 4)
  assert helpers.read_json(tmp_path / 'ranks' / 'rank_0.json')['steps'] == 7


@pytest.mark.parametrize('override, expected', [
    ('--config.no_such_key=1', 'no_such_key'),
    ('--config.steps=abc', 'abc'),
    ('--no_such_flag=1', 'no_such_flag'),
])
def test_bad_config_is_one_line_and_exit_2(tmp_path, override, expected):
  result = helpers.run_launcher(
      [f'--config={LINEAR}', f'--workdir={tmp_path}', override], timeout=60)
  assert result.returncode == 2
  line = _one_error_line(result)
  assert line.startswith('podrun: error:') and expected in line


def test_a_misspelt_config_field_reads_without_python_escapes(tmp_path):
  result = helpers.run_launcher([
      f'--config={LINEAR}', f'--workdir={tmp_path}',
      '--config.optimizer.learnin_rate=0.5'
  ],
                                timeout=60)
  assert result.returncode == 2
  line = _one_error_line(result)
  assert line.endswith("no config field 'learnin_rate'. Did you mean "
                       '"learning_rate" instead of "learnin_rate"?'), line
  assert '\\' not in line


def test_a_missing_or_broken_config_file_says_so(tmp_path):
  missing = helpers.run_launcher(
      ['--config=configs/no_such_config.py', f'--workdir={tmp_path}'],
      timeout=60)
  assert missing.returncode == 2
  assert ("--config=configs/no_such_config.py: no such file "
          "'configs/no_such_config.py'") in _one_error_line(missing)
  broken = tmp_path / 'broken.py'
  broken.write_text('def get_config():\n  raise ValueError("broken here")\n')
  result = helpers.run_launcher([f'--config={broken}', f'--workdir={tmp_path}'],
                                timeout=60)
  assert result.returncode == 2
  assert 'ValueError: broken here' in _one_error_line(result)


def test_missing_and_unimportable_workloads(tmp_path):
  config = tmp_path / 'no_workload.py'
  config.write_text('from runtime import config_base\n\n'
                    'def get_config():\n  return config_base.get_config()\n')
  result = helpers.run_launcher([f'--config={config}'], timeout=60)
  assert result.returncode == 2
  assert 'names no workload' in _one_error_line(result)

  result = helpers.run_launcher([
      f'--config={LINEAR}', f'--workdir={tmp_path}',
      '--config.workload=no_such_module:main'
  ],
                                timeout=60)
  assert result.returncode == 2
  assert "cannot import the workload module 'no_such_module'" in (result.stderr)
  assert (f'Importable are the installed packages and the current directory, '
          f'{helpers.REPO}') in result.stderr


def test_a_user_module_outside_the_package_runs(tmp_path):
  (tmp_path / 'my_experiment.py').write_text(
      'import jax\n\n'
      'def run(config, workdir):\n'
      '  return {"devices": jax.device_count(), "steps": config.steps}\n')
  result = helpers.run_launcher([
      f'--config={helpers.REPO / LINEAR}', '--workdir=out',
      '--config.workload=my_experiment:run'
  ],
                                cwd=tmp_path)
  assert result.returncode == 0, result.output
  summary = helpers.read_json(tmp_path / 'out' / 'summary.json')
  assert summary['results'] == {'devices': 8, 'steps': 200}


def test_dot_product_and_its_misaligned_case(tmp_path):
  ok = helpers.run_launcher([
      '--config=configs/dot_product.py', f'--workdir={tmp_path}',
      '--config.num_pairs=800000'
  ])
  assert ok.returncode == 0, ok.output
  results = helpers.read_json(tmp_path / 'summary.json')['results']
  assert results['equal'] and results['pmap_output_shape'] == [8, 100000]

  bad = helpers.run_launcher([
      '--config=configs/dot_product.py', f'--workdir={tmp_path}',
      '--config.num_pairs=800000', '--config.reshape=False'
  ])
  assert bad.returncode == 2
  assert 'must have size 8 (the local device count), not 800000' in bad.stderr
  assert 'Reshape it to (8, 100000, 3)' in bad.stderr


def test_jax_touched_while_loading_the_config(tmp_path):
  config = tmp_path / 'eager.py'
  config.write_text('import jax\nfrom configs import linear_regression\n'
                    'jax.devices()\n\n'
                    'def get_config():\n'
                    '  return linear_regression.get_config()\n')
  result = helpers.run_launcher([f'--config={config}', f'--workdir={tmp_path}'],
                                timeout=60)
  assert result.returncode == 4
  assert 'JAX was used before jax.distributed.initialize' in result.stderr
  assert f'while the config {config} (or a module it imports)' in (
      result.stderr)


def test_partial_coordinator_flags(tmp_path):
  result = helpers.run_launcher(
      [f'--config={LINEAR}', f'--workdir={tmp_path}', '--num_processes=2'],
      timeout=60)
  assert result.returncode == 4
  assert ('--num_processes=2 given without --coordinator_address and '
          '--process_id') in result.stderr


def test_dry_run_starts_nothing(tmp_path):
  result = helpers.run_launcher(
      [f'--config={LINEAR}', f'--workdir={tmp_path}', '--dry_run'], timeout=60)
  assert result.returncode == 0
  assert 'this process would run:' in result.stdout
  assert 'not started (one process, no coordinator)' in result.stdout
  assert not (tmp_path / 'summary.json').exists()


def test_the_readme_workload_runs_from_a_directory_of_its_own(tmp_path):
  # The two files of the README's "Your own workload", run as it says:
  # `podrun` (the console script) from their directory.
  readme = (helpers.REPO / 'README.md').read_text()
  blocks = re.findall(r'```python\n(# my_project/(\S+?)\.py.*?)```', readme,
                      re.S)
  assert sorted(
      name for _, name in blocks) == ['my_regression', 'my_regression_config']
  for body, name in blocks:
    (tmp_path / f'{name}.py').write_text(body)
  podrun = pathlib.Path(sys.executable).parent / 'podrun'
  assert podrun.exists(), 'the project installs the podrun console script'
  env = helpers.launcher_env()
  env.pop('PYTHONPATH')  # Only what the install and the directory give.
  proc = subprocess.Popen(
      [str(podrun), '--config=my_regression_config.py', '--config.steps=20'],
      cwd=tmp_path,
      env=env,
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True)
  result = helpers.finish(proc, 120, time.monotonic())
  assert result.returncode == 0, result.output
  summary = helpers.read_json(tmp_path / 'workdirs' / 'my_regression_config' /
                              'summary.json')
  assert summary['workload'] == 'my_regression:train_and_evaluate'
  assert summary['steps'] == 20
  assert summary['final_metrics']['loss'] < 1.0
  # The log says that final_metrics are step 20's alone, not a mean.
  said = re.search(
      r'final_metrics, of step 20 alone: .*loss=(\S+) \(each '
      r'step line above is a mean', result.stderr)
  assert said, result.stderr[-2000:]
  assert float(said.group(1)) == pytest.approx(summary['final_metrics']['loss'],
                                               rel=1e-5)
  assert helpers.wait_for(lambda: not _group_alive(proc.pid), 10)


def _group_alive(pgid: int) -> bool:
  try:
    os.killpg(pgid, 0)
  except ProcessLookupError:
    return False
  return True


def test_ctrl_c_of_a_single_process_says_how_to_resume(tmp_path):
  proc = helpers.start_launcher([
      f'--config={helpers.PROBE_CONFIG}', f'--workdir={tmp_path}',
      '--config.steps=1000000', '--config.checkpoint_every=5'
  ])
  started = time.monotonic()
  try:
    assert helpers.wait_for(
        lambda:
        (tmp_path / 'metrics.jsonl').exists() or proc.poll() is not None, 90)
    assert proc.poll() is None, proc.communicate()
    os.kill(proc.pid, signal.SIGINT)
    result = helpers.finish(proc, 60, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 130, result.output
  assert 'the same command resumes from the newest checkpoint' in (
      result.stderr)


def test_a_workdir_url_is_a_bucket_or_refused_never_a_directory(tmp_path):
  # A bucket's workdir runs (tests/test_buckets.py); these never start.
  for workdir, says in (('gs://', 'name the bucket, as gs://BUCKET/RUN'),
                        ('s3://bar-bucket/y/wd',
                         'a workdir is a local or shared directory or '
                         'a gs:// bucket')):
    result = helpers.run_launcher([
        f'--config={helpers.REPO}/configs/linear_regression.py',
        '--config.steps=5', f'--workdir={workdir}'
    ],
                                  cwd=tmp_path)
    assert result.returncode == 2, result.output  # CONFIG_ERROR.
    assert f'--workdir={workdir}: {says}' in result.stderr, result.stderr
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    'spelling, said',
    [
        # Flax's examples' configs/default.py: plain values where podrun has
        # sections; ml_collections' TypeError names neither.
        ("config.model = 'ResNet50'",
         "config.model is podrun's section of fields (runtime/config_base.py), "
         "not a value: Flax's examples set config.model = 'ResNet50': write "
         "config.model.name = 'ResNet50' and read config.model.name in the "
         'workload'),
        ('config.profile = True',
         "config.profile is podrun's section of fields (runtime/config_base.py), "
         "not a value: Flax's examples set config.profile = True: set "
         'config.profile.num_steps'),
    ])
def test_a_plain_value_for_one_of_podrun_s_sections_is_named(
    tmp_path, spelling, said):
  config = tmp_path / 'default.py'
  config.write_text('from configs import linear_regression\n\n'
                    'def get_config():\n'
                    '  config = linear_regression.get_config()\n'
                    f'  {spelling}\n'
                    '  return config\n')
  result = helpers.run_launcher([f'--config={config}', f'--workdir={tmp_path}'],
                                timeout=60)
  assert result.returncode == 2
  assert said in result.stderr, result.stderr
  # And on the command line.
  flag = helpers.run_launcher([
      '--config=configs/linear_regression.py', '--config.profile=True',
      f'--workdir={tmp_path}'
  ],
                              timeout=60)
  assert flag.returncode == 2
  assert ("config.profile is podrun's section of fields"
          in flag.stderr), (flag.stderr)


def test_min_replicas_counts_processes_and_refuses_what_cannot_go_on(tmp_path):
  """--min_replicas is --min_processes in replicas: one of the two, a pod
  of processes, and a replica that a lost process takes whole."""
  base = [f'--config={LINEAR}', f'--workdir={tmp_path}', '--dry_run']
  both = helpers.run_launcher(
      [*base, '--local_processes=4', '--min_processes=3', '--min_replicas=3'])
  assert both.returncode == 2
  assert ('--min_processes and --min_replicas count the same processes '
          'here: give one of them') in both.stderr, both.stderr
  spanning = helpers.run_launcher([
      *base, '--local_processes=4', '--min_replicas=2',
      '--config.state_layout=sharded', '--config.replica=all'
  ])
  assert spanning.returncode == 2
  assert ("config.state_layout='sharded' with config.replica='all' in an "
          'elastic job (processes 2-4, --min_replicas=2): a lost process '
          'would take shards') in spanning.stderr, spanning.stderr
  too_many = helpers.run_launcher(
      [*base, '--local_processes=4', '--min_replicas=5'])
  assert too_many.returncode == 2
  assert '--min_replicas=5 with --local_processes=4' in too_many.stderr
  # Processes started by hand take --min_replicas (tests/test_multihost.py),
  # but their scheduler, not podrun, starts them again.
  alone = helpers.run_launcher([*base, '--min_replicas=2', '--regrow_after=5'])
  assert alone.returncode == 2
  assert '--regrow_after needs --local_processes' in alone.stderr
  planned = helpers.run_launcher(
      [*base, '--local_processes=4', '--min_replicas=3'])
  assert planned.returncode == 0, planned.output


@pytest.mark.parametrize('module, command', [('launcher', 'podrun'),
                                             ('launcher.tpu', 'podrun-tpu'),
                                             ('launcher.ray', 'podrun-ray')])
def test_each_command_says_its_version(module, command):
  done = subprocess.run([sys.executable, '-m', module, '--version'],
                        cwd=helpers.REPO,
                        env=helpers.launcher_env(),
                        capture_output=True,
                        text=True,
                        timeout=60,
                        check=False)
  assert done.returncode == 0, done.stderr
  assert re.fullmatch(rf'{command} 0\.2\.\d+ \(JAX \S+, Python \S+\)\n',
                      done.stdout), done.stdout
