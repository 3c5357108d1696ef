"""launcher/process/compilation.py: the source paths a compiled program
carries (the same program from two copies of the code in different
directories, as a TPU pod's workers unpack it) and where the persistent
cache is used."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import pytest

from launcher.process import compilation
from runtime.common import layout

pytestmark = pytest.mark.devices

_MODULE = '''
import jax.numpy as jnp

def step(x):
  return jnp.tanh(x) * 2.0
'''


def _lowered_text(root: str, name: str) -> str:
  """The program of `step` from the copy under `root`, with its locations."""
  package = os.path.join(root, 'workload')
  os.makedirs(package, exist_ok=True)
  with open(os.path.join(package, 'model.py'), 'w') as f:
    f.write(_MODULE)
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(package, 'model.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  lowered = jax.jit(module.step).lower(jnp.ones(4))
  return lowered.as_text(debug_info=True)


@pytest.fixture
def canonical():
  yield
  jax.config.update('jax_hlo_source_file_canonicalization_regex', None)


def test_two_copies_lower_the_same_program(tmp_path, canonical):
  first, second = str(tmp_path / 'worker_0'), str(tmp_path / 'worker_1/code')
  # One call site for both: the caller's line is in the locations too.
  apart = [
      _lowered_text(root, name)
      for root, name in ((first, 'copy_a'), (second, 'copy_b'))
  ]
  assert apart[0] != apart[1]  # The locations alone differ.
  assert first in apart[0]

  # tmp_path holds both roots: the longest root is taken off first.
  compilation.same_source_paths(['', str(tmp_path), first, second, '/'])
  together = [
      _lowered_text(root, name)
      for root, name in ((first, 'copy_c'), (second, 'copy_d'))
  ]
  assert together[0] == together[1]
  assert 'workload/model.py' in together[0]
  assert str(tmp_path) not in together[0]
  assert 'worker_0' not in together[0]


def test_a_file_under_no_root_keeps_its_path(tmp_path, canonical):
  compilation.same_source_paths([str(tmp_path / 'elsewhere')])
  text = _lowered_text(str(tmp_path / 'outside'), 'copy_e')
  assert str(tmp_path / 'outside' / 'workload' / 'model.py') in text


@pytest.fixture
def cache_settings():
  names = ('jax_compilation_cache_dir',
           'jax_persistent_cache_min_compile_time_secs',
           'jax_persistent_cache_min_entry_size_bytes')
  before = {n: getattr(jax.config, n) for n in names}
  yield
  for name, value in before.items():
    jax.config.update(name, value)


def test_the_cache_is_the_workdirs_unless_cpu_processes_are_several(
    tmp_path, cache_settings):
  before = jax.config.jax_compilation_cache_dir
  assert compilation.use_cache(None, layout.Record(str(tmp_path)), 'cpu',
                               2) is None
  assert compilation.use_cache('', layout.Record(str(tmp_path)), 'tpu',
                               4) is None
  assert jax.config.jax_compilation_cache_dir == before
  path = compilation.use_cache(None, layout.Record(str(tmp_path)), 'tpu', 4)
  assert path == str(tmp_path / 'compilation_cache')
  assert jax.config.jax_compilation_cache_dir == path
  assert compilation.use_cache(str(tmp_path / 'c'), layout.Record('x'), 'cpu',
                               1) == str(tmp_path / 'c')
