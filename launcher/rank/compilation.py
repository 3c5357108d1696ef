"""JAX's compilation, seen from one process: its persistent cache, and the
seconds it takes counted into the goodput ledger.

JAX reports compilation through `jax.monitoring` events; their names are the
part most likely to move between JAX releases, so they are read here alone.

Example:
  >>> use_cache(None, '/runs/mnist')   # /runs/mnist/compilation_cache
  >>> count_into(goodput.current())
"""

import os
from typing import Optional

import jax

from runtime.common import goodput
from runtime.common import progress

# Seconds spent compiling: tracing, lowering, the backend (one event each).
# The same names in JAX 0.10 to 0.12 (tests/test_jax_versions.py).
COMPILE_EVENT_PREFIX = '/jax/core/compile/'
# Seconds spent reading a program back from the persistent cache.
CACHE_RETRIEVAL_EVENT = '/jax/compilation_cache/cache_retrieval_time_sec'
CACHE_HIT_EVENT = '/jax/compilation_cache/cache_hits'


def count_into(ledger: goodput.Ledger) -> None:
  """Counts every later compilation (and cache read) into the ledger.

  The seconds go to `compile`, out of the step that paid for them
  (goodput.on_compile); cache hits go to the ledger's `compile_cache_hits`.
  """

  def on_duration(event: str, duration: float, **kwargs) -> None:
    del kwargs
    if event.startswith(COMPILE_EVENT_PREFIX) or (
        event == CACHE_RETRIEVAL_EVENT):
      goodput.on_compile(duration)
      progress.took('compile', duration)  # The hang watchdog allows for it.

  def on_event(event: str, **kwargs) -> None:
    del kwargs
    if event == CACHE_HIT_EVENT:
      ledger.note(compile_cache_hits=ledger.notes.get(
          'compile_cache_hits', 0) + 1)

  jax.monitoring.register_event_duration_secs_listener(on_duration)
  jax.monitoring.register_event_listener(on_event)


def use_cache(directory: Optional[str], workdir: str) -> None:
  """JAX's persistent compilation cache, so that a restart skips compiling.

  Args:
    directory: --compilation_cache_dir: None for WORKDIR/compilation_cache,
      '' for none, else the place every attempt of the job reaches (a gs://
      path works where JAX supports it).
    workdir: the job's workdir.
  """
  if directory == '':
    return
  path = directory or os.path.join(workdir, 'compilation_cache')
  jax.config.update('jax_compilation_cache_dir', path)
  # Cache every program: on a restart even short compilations add up.
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
