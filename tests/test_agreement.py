"""Agreement before step 1: digests compared, mismatches named, jobs stopped."""

import json
import shutil

from ml_collections import config_dict
import pytest

from runtime import agreement
from tests import helpers

pytestmark = pytest.mark.unit


def test_differences_name_the_ranks_on_each_side_and_both_values():
  digests = {r: {'config.lr': '0.001', 'env.XLA_FLAGS': ''} for r in range(4)}
  digests[3] = {'config.lr': '0.5', 'env.XLA_FLAGS': ''}
  assert agreement.differences(digests) == [
      'config.lr: ranks 0-2 0.001, rank 3 0.5'
  ]
  digests[1] = {'config.lr': '0.001', 'env.XLA_FLAGS': '--x=1'}
  assert agreement.differences(digests) == [
      'config.lr: ranks 0-2 0.001, rank 3 0.5',
      'env.XLA_FLAGS: ranks 0, 2-3 (unset), rank 1 --x=1'
  ]
  assert agreement.differences({
      0: {
          'a': '1'
      },
      1: {}
  }) == ['a: rank 0 1, rank 1 (missing)']
  assert agreement.differences({0: {'a': '1'}, 1: {'a': '1'}}) == []


def test_the_config_digest_leaves_out_local_paths():
  config = config_dict.ConfigDict({
      'seed': 3,
      'data_dir': '/mnt/a',
      'checkpoint_dir': '/mnt/b',
      'optimizer': {
          'learning_rate': 0.1
      },
      'restore_may_change': ('x',)
  })
  assert agreement.config_fields(config.to_dict()) == {
      'config.optimizer.learning_rate': '0.1',
      'config.restore_may_change': json.dumps(['x']),
      'config.seed': '3'
  }


def test_describe_process_covers_code_versions_and_environment(monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_backend_optimization_level=2')
  config = config_dict.ConfigDict(
      {'workload': 'runtime.workloads.linear_regression:train_and_evaluate'})
  fields = agreement.describe_process(config.to_dict())
  assert fields['env.XLA_FLAGS'] == '--xla_backend_optimization_level=2'
  for package in ('python', 'jax', 'jaxlib', 'libtpu', 'flax', 'optax',
                  'orbax-checkpoint', 'numpy'):
    assert f'version.{package}' in fields
  assert fields['version.libtpu'] == 'absent'  # No TPU here.
  assert len(fields['code.podrun']) == 16
  assert fields['code.workload'] not in ('', 'not found')


def test_the_code_hash_changes_with_any_file(tmp_path):
  for package in agreement.CODE_PACKAGES:
    shutil.copytree(helpers.REPO / package,
                    tmp_path / package,
                    ignore=shutil.ignore_patterns('__pycache__'))
  before = agreement.code_hash(str(tmp_path))
  assert before == agreement.code_hash(str(helpers.REPO))
  with open(tmp_path / 'runtime' / 'step.py', 'a') as f:
    f.write('# one more line\n')
  assert agreement.code_hash(str(tmp_path)) != before
