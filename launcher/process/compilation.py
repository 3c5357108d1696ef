"""JAX's compilation, seen from one process: its persistent cache, and the
seconds it takes counted into the goodput ledger.

The events themselves come from runtime/compile_events.py, the process's one
listener.

Example:
  >>> use_cache(None, '/runs/mnist')   # /runs/mnist/compilation_cache
  >>> count_into(goodput.current())
"""

from typing import Optional

import jax

from runtime.common import goodput
from runtime.common import layout
from runtime.common import progress
from runtime import compile_events


def count_into(ledger: goodput.Ledger) -> None:
  """Counts every later compilation (and cache read) into the ledger.

  The seconds go to `compile`, out of the step that paid for them
  (goodput.on_compile); cache hits go to the ledger's `compile_cache_hits`.
  """

  def on_seconds(seconds: float) -> None:
    goodput.on_compile(seconds)
    progress.took('compile', seconds)  # The hang watchdog allows for it.

  def on_cache_hit() -> None:
    ledger.note(
        compile_cache_hits=(ledger.notes.compile_cache_hits or 0) + 1)

  compile_events.on_seconds(on_seconds)
  compile_events.on_cache_hit(on_cache_hit)


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
  path = directory or layout.Record(workdir).compilation_cache()
  jax.config.update('jax_compilation_cache_dir', path)
  # Cache every program: on a restart even short compilations add up.
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
