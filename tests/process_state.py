"""What a test may leave behind in its pytest process, put back after it.

An xdist worker runs module after module in an order that changes from run
to run, so anything process-wide that one test changes (a module's global,
a signal handler, an environment variable, a directory every test shares)
would decide how a later test ends. `conftest._fresh_process_state` calls
`fresh()` before every test and `restore()` after it; `tests/
test_process_state.py` fails when runtime/ or launcher/ grows a module-level
state that is neither here nor in `KEPT` with its reason.

Example:
  >>> saved = process_state.fresh()
  >>> ...                            # the test
  >>> process_state.restore(saved)
"""

import dataclasses
import importlib
import os
import shutil
import signal
import tempfile
from typing import Any, Callable

# Module-level state that each test starts from anew: (module, name) ->
# a function of the module that makes the fresh value.
FRESH: dict[tuple[str, str], Callable[[Any], Any]] = {
    # What launcher.process installed as the launcher's word (first: the
    # progress state below reads it).
    ('runtime.common.handoff', '_installed'):
        lambda m: None,
    # The step reports the stall watchdog and the heartbeat read.
    ('runtime.common.progress', '_progress'):
        lambda m: m._Progress(),
    # The goodput ledger of "this process" (with its running step clock).
    ('runtime.common.goodput', '_this'):
        lambda m: m._ThisProcess(),
    # The bucket mirror that every way out finishes.
    ('launcher.common.record_mirror', '_current'):
        lambda m: None,
    # --barrier_timeout, as the last rank set-up in this process set it.
    ('runtime.coordination', '_default_timeout_s'):
        lambda m: m.DEFAULT_TIMEOUT_S,
    # Who hears of each compilation: a ledger a finished test counted into
    # would go on counting every later test's compilations.
    ('runtime.compile_events', '_seconds_callbacks'):
        lambda m: [],
    ('runtime.compile_events', '_cache_hit_callbacks'):
        lambda m: [],
    # The one search for Google credentials of "this process", and what it
    # found: a test under another STORAGE_EMULATOR_HOST searches anew.
    ('runtime.common.gcs_auth', '_search'):
        lambda m: None,
    ('runtime.common.gcs_auth', '_found'):
        lambda m: {},
    # The config fields read since the launcher handed the config on.
    ('runtime.config_reads', '_reads'):
        lambda m: m.stop(),
    # This process's GPU setup, for run.json.
    ('launcher.process.gpu_host', '_current'):
        lambda m: m.remember(None),
}

# Module-level state kept across tests on purpose, with the reason.
KEPT = {
    ('runtime.checkpoints.checkpoint', '_check_count'):
        'only makes check names unique; going back to 0 could reuse one',
    ('runtime.compile_events', '_lock'):
        'a lock',
    ('runtime.config_reads', '_originals'):
        "ConfigDict's own methods, the same for the life of the process",
    ('runtime.common.gcs_auth', '_lock'):
        'a lock',
    ('runtime.compile_events', '_listening'):
        "JAX's listener is registered once a process and cannot be removed",
    ('runtime.compile_events', '_compiles'):
        'read as a difference within one thread (count_in_this_thread)',
    ('runtime.compile_events', '_seconds'):
        'read as a difference within one thread (seconds_in_this_thread)',
    ('runtime.loop', '_copied'):
        'a jitted function, the same for every run (its programs cached)',
    ('runtime.common.record_reader', '_source'):
        'set only in a data worker process (runtime/readers.py), never in '
        "the tests' own",
    ('launcher.process.obituary', '_traceback_file'):
        'faulthandler writes there for the life of a rank process; no test '
        'calls obituary.start in its own process',
}

# The environment the project and its tests read: cluster detection
# (SLURM_, OMPI_, TPU_, MEGASCALE_), the storage emulator and the auth
# libraries, JAX's and XLA's settings, the fakes' switches, podrun's own.
ENV_PREFIXES = ('PODRUN_', 'JAX_', 'XLA_', 'FAKE_', 'SLURM_', 'OMPI_', 'PMI_',
                'PMIX_', 'TPU_', 'MEGASCALE_', 'CLOUDSDK_',
                'STORAGE_EMULATOR_HOST', 'TENSORSTORE_', 'GCE_', 'GOOGLE_',
                'NO_GCE_CHECK', 'CLOUD_TPU_')

# Directories a process's tests would otherwise share (tests/conftest.py
# sets a session-wide default): the local checkpoint tier and the record
# copies of gs:// workdirs. Each test gets its own.
PER_TEST_DIRS = ('PODRUN_LOCAL_CHECKPOINT_DIR', 'PODRUN_RECORD_CACHE')

# SIGKILL and SIGSTOP cannot be handled; the others a test may catch.
_SIGNALS = tuple(s for s in signal.valid_signals()
                 if s not in (signal.SIGKILL, signal.SIGSTOP))


@dataclasses.dataclass
class Saved:
  """What `fresh` replaced, for `restore`."""
  values: dict[tuple[str, str], Any]
  environ: dict[str, str]
  handlers: dict[int, Any]
  directories: list[str]


def _ours(name: str) -> bool:
  return name.startswith(ENV_PREFIXES)


def _handlers() -> dict[int, Any]:
  out = {}
  for signum in _SIGNALS:
    try:
      out[signum] = signal.getsignal(signum)
    except (OSError, ValueError):
      pass
  return out


def fresh() -> Saved:
  """Gives this process fresh module state and test directories; returns
  what was there."""
  values = {}
  for (module_name, name), make in FRESH.items():
    module = importlib.import_module(module_name)
    values[(module_name, name)] = getattr(module, name)
    setattr(module, name, make(module))
  environ = {k: v for k, v in os.environ.items() if _ours(k)}
  directories = []
  for variable in PER_TEST_DIRS:
    directories.append(tempfile.mkdtemp(prefix=f'{variable.lower()}_'))
    os.environ[variable] = directories[-1]
  return Saved(values, environ, _handlers(), directories)


def restore(saved: Saved) -> None:
  """Puts back what `fresh` replaced and what the test changed: module
  state, the environment's project variables and every signal handler."""
  for (module_name, name), value in saved.values.items():
    setattr(importlib.import_module(module_name), name, value)
  for name in [k for k in os.environ if _ours(k)]:
    if name not in saved.environ:
      del os.environ[name]
  os.environ.update(saved.environ)
  for signum, handler in saved.handlers.items():
    # None: a handler not set from Python, which Python cannot set back.
    if handler is not None and signal.getsignal(signum) != handler:
      signal.signal(signum, handler)
  for directory in saved.directories:
    shutil.rmtree(directory, ignore_errors=True)
