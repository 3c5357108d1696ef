"""Every test runs with 8 emulated CPU devices, set before JAX is imported."""

import os

os.environ['XLA_FLAGS'] = ' '.join(
    [f for f in os.environ.get('XLA_FLAGS', '').split()
     if not f.startswith('--xla_force_host_platform_device_count')] +
    ['--xla_force_host_platform_device_count=8'])
os.environ['JAX_PLATFORMS'] = 'cpu'

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


def pytest_configure(config):
  del config
  count = jax.device_count()
  if count != 8:
    raise pytest.UsageError(
        f'the tests need 8 emulated CPU devices, JAX sees {count}: something '
        'initialised JAX before tests/conftest.py set XLA_FLAGS.')
