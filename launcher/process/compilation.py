"""JAX's compilation, seen from one process: its persistent cache, the
source paths its programs carry, and the seconds it takes counted into the
goodput ledger.

The events themselves come from runtime/compile_events.py, the process's one
listener.

Example:
  >>> use_cache(None, '/runs/mnist', 'tpu', 4)  # /runs/mnist/compilation_cache
  >>> count_into(goodput.current())
  >>> same_source_paths(sys.path)   # /w0/podrun/runtime/step.py -> runtime/step.py
"""

import os
import re
from typing import Iterable, Optional

from absl import logging
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
    ledger.note(compile_cache_hits=(ledger.notes.compile_cache_hits or 0) + 1)

  compile_events.on_seconds(on_seconds)
  compile_events.on_cache_hit(on_cache_hit)


def use_cache(directory: Optional[str], record: layout.Record, platform: str,
              process_count: int) -> Optional[str]:
  """JAX's persistent compilation cache, so that a restart skips compiling.

  Args:
    directory: --compilation_cache_dir: None for WORKDIR/compilation_cache,
      '' for none, else the place every attempt of the job reaches (a gs://
      path works where JAX supports it).
    record: the job's record.
    platform, process_count: the job's (topology.Topology's).
  Returns:
    The cache's path, or None where the job runs without one.
  """
  if directory == '':
    return None
  if platform == 'cpu' and process_count > 1:
    # On JAX 0.12.1 a CPU program with cross-process collectives, read back
    # from the cache, hung in its first collective (a local pod's restart,
    # every rank waiting in the step); a CPU step compiles in seconds.
    logging.info(
        'no persistent compilation cache: %d processes on the CPU '
        'compile afresh on every attempt', process_count)
    return None
  path = directory or record.compilation_cache()
  jax.config.update('jax_compilation_cache_dir', path)
  # Cache every program: on a restart even short compilations add up.
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  return path


def same_source_paths(import_roots: Iterable[str]) -> str:
  """Makes the source paths in every compiled program's metadata relative to
  the directory each file was imported from, so that every process of a job
  lowers the same program wherever its copy of the code lies.

  Why: workers that unpack the code into directories of their own (a TPU
  pod's workers, hosts with different home directories) otherwise lower
  programs that differ in their locations alone. On JAX 0.12.1's CPU
  collectives such a job hung in its first step; it also keeps the
  persistent cache's keys the same on every host.

  Args:
    import_roots: the directories code is imported from (sys.path); '' is
      the current directory.
  Returns:
    The regex given to jax_hlo_source_file_canonicalization_regex: the
    roots, longest first, each with its trailing slash.
  """
  roots = {
      os.path.abspath(root or os.curdir).rstrip(os.sep) for root in import_roots
  }
  ordered = sorted((r for r in roots if r), key=len, reverse=True)
  pattern = '^(?:' + '|'.join(re.escape(r + os.sep) for r in ordered) + ')'
  jax.config.update('jax_hlo_source_file_canonicalization_regex', pattern)
  return pattern
