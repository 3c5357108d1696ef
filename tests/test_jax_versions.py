"""What podrun relies on in JAX, checked against the JAX installed here.

CI runs this on both ends of the supported range (JAX 0.10.2 on Python 3.11,
the newest JAX on Python 3.13). Each test pins one place where JAX could
move between releases; the code that uses it sits in one module each:
runtime/coordination.py (the coordination-service client),
launcher/process/compilation.py (the cache options), runtime/compile_events.py
(the monitoring events) and
runtime/parallelism/ (pmap and jit(shard_map)).
"""

import os
import subprocess
import sys
import textwrap

import jax
from jax._src import distributed
from jax._src import xla_bridge
import jax.numpy as jnp
import numpy as np
import pytest

from runtime import compile_events
from runtime import coordination
from runtime import parallelism
from tests import helpers

pytestmark = pytest.mark.devices


def test_the_backend_check_sees_this_process_started():
  assert xla_bridge.backends_are_initialized()
  assert coordination.backend_started()


def test_the_coordination_client_has_every_method_the_job_uses():
  # jax.distributed keeps its client here; a single process has none.
  assert hasattr(distributed, 'global_state')
  assert hasattr(distributed.global_state, 'client')
  assert hasattr(distributed.global_state, 'coordinator_address')
  from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
  methods = set(dir(_jax.DistributedRuntimeClient))
  assert set(coordination.CLIENT_METHODS) <= methods, (
      set(coordination.CLIENT_METHODS) - methods)


def test_the_compilation_events_the_ledger_counts_still_fire():
  seen = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, duration, **kwargs: seen.append(event))
  fresh = jax.jit(lambda x: jnp.sin(x) * 3.25 + x.sum())
  fresh(np.arange(7.0)).block_until_ready()
  assert any(
      e.startswith(compile_events.COMPILE_EVENT_PREFIX) for e in seen), (sorted(
          set(seen)))


def test_the_compilation_cache_is_written_and_read_back(tmp_path):
  # Two fresh processes: the second reads the program the first compiled.
  script = textwrap.dedent(f'''
      import jax, jax.numpy as jnp, numpy as np
      from launcher.process import compilation
      from runtime.common import goodput, layout
      ledger = goodput.Ledger()
      goodput.use(ledger)
      compilation.use_cache({str(tmp_path)!r}, layout.Record('/nonexistent'),
                            'cpu', 1)
      compilation.count_into(ledger)
      jax.jit(lambda x: jnp.cos(x) * 1.5)(np.arange(5.0)).block_until_ready()
      print('hits', ledger.notes.compile_cache_hits or 0)
  ''')
  hits = []
  for _ in range(2):
    result = subprocess.run([sys.executable, '-c', script],
                            cwd=helpers.REPO,
                            env=helpers.launcher_env(JAX_PLATFORMS='cpu'),
                            capture_output=True,
                            text=True,
                            timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    hits.append(int(result.stdout.split()[-1]))
  assert os.listdir(tmp_path)
  assert hits[0] == 0 and hits[1] >= 1, hits


def test_pmap_and_shard_map_agree_on_8_devices():
  # pmap itself runs on jit(shard_map) since JAX 0.8: both ways must give
  # the same collectives over the same axis.
  assert jax.device_count() == 8, jax.devices()

  def per_device(x):
    index = jax.lax.axis_index(parallelism.DATA_AXIS)
    return jax.lax.pmean(x, parallelism.DATA_AXIS), index[None]

  rows = np.arange(32.0, dtype=np.float32).reshape(32, 1)
  means, indices = [], []
  for par in (parallelism.PMAP, parallelism.SHARD_MAP):
    mean, index = par.map(per_device, in_axes=(0,),
                          out_axes=(None, 0))(par.put_batch(rows))
    means.append(par.to_host(mean))
    indices.append(np.asarray(index).reshape(-1))
  np.testing.assert_array_equal(means[0], means[1])
  np.testing.assert_array_equal(means[0], rows.reshape(8, 4, 1).mean(0))
  np.testing.assert_array_equal(indices[0], np.arange(8))
  np.testing.assert_array_equal(indices[1], np.arange(8))
