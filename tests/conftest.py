"""Every test runs with 8 emulated CPU devices, set before JAX is imported."""

import os

os.environ['XLA_FLAGS'] = ' '.join(
    [f for f in os.environ.get('XLA_FLAGS', '').split()
     if not f.startswith('--xla_force_host_platform_device_count')] +
    ['--xla_force_host_platform_device_count=8'])
os.environ['JAX_PLATFORMS'] = 'cpu'

import shutil  # pylint: disable=g-import-not-at-top,wrong-import-position
import tempfile  # pylint: disable=g-import-not-at-top,wrong-import-position

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

_CACHE_DIR = []


# Test tiers (pytest -m): `unit` needs neither devices nor processes,
# `devices` runs in this process on its 8 emulated devices, `processes`
# starts launcher processes. Tests that start processes in a file of another
# tier carry @pytest.mark.processes themselves.
_PROCESS_FILES = ('test_cli.py', 'test_gang.py', 'test_local_pod.py',
                  'test_multihost.py', 'test_preemption.py',
                  'test_launch_tpu_pod.py', 'test_cluster_supervision.py')
_DEVICE_FILES = ('test_train.py', 'test_checkpoint.py', 'test_parallel.py',
                 'test_parallelism.py', 'test_evaluate.py', 'test_mnist_cnn.py',
                 'test_hooks.py', 'test_tensorboard.py')


def pytest_collection_modifyitems(config, items):
  del config
  for item in items:
    if item.get_closest_marker('processes'):
      continue
    name = item.path.name
    tier = ('processes' if name in _PROCESS_FILES else
            'devices' if name in _DEVICE_FILES else 'unit')
    item.add_marker(getattr(pytest.mark, tier))


def pytest_configure(config):
  del config
  # The in-process tests train the same small models many times: JAX's
  # persistent compilation cache, as the launcher uses it, compiles each
  # program once per session.
  _CACHE_DIR.append(tempfile.mkdtemp(prefix='podrun_test_compilation_'))
  jax.config.update('jax_compilation_cache_dir', _CACHE_DIR[0])
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  count = jax.device_count()
  if count != 8:
    raise pytest.UsageError(
        f'the tests need 8 emulated CPU devices, JAX sees {count}: something '
        'initialised JAX before tests/conftest.py set XLA_FLAGS.')


def pytest_unconfigure(config):
  del config
  for directory in _CACHE_DIR:
    shutil.rmtree(directory, ignore_errors=True)
