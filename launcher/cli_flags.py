"""The launcher's flags (`python -m launcher`), each defined once with its
line in the usage text (launcher/usage.py); launcher/cli.py reads them.
A flag that a typed value carries past the launcher is declared on that
value's field (launcher/common/flag_spec.py) and defined here from it.

Example:
  >>> cli_flags.WORKDIR.value
  'workdirs/mnist'
  >>> cli_flags.values_of(process_flags.WatchFlags, cli_flags.WATCH)
  WatchFlags(heartbeat_timeout=15.0, ...)
"""

from typing import Any, Callable

from absl import flags
from ml_collections import config_flags

from launcher import restart_flags
from launcher import usage
from launcher.common import flag_spec
from launcher.common import gpus
from launcher.common import process_flags
from launcher.local import monitor


def define_from(cls: type) -> dict[str, Any]:
  """Defines an absl flag for each flag `cls`'s fields declare
  (flag_spec.specs), each in its --help group; returns {field: FlagHolder}."""
  define: dict[type, Callable[..., Any]] = {
      bool: flags.DEFINE_bool,
      int: flags.DEFINE_integer,
      float: flags.DEFINE_float,
      str: flags.DEFINE_string
  }
  holders = {}
  for spec in flag_spec.specs(cls):
    if spec.choices:
      holder = flags.DEFINE_enum(spec.name, spec.default, spec.choices,
                                 spec.help)
    else:
      holder = define[spec.kind](spec.name, spec.default, spec.help)
    usage.declare(holder, spec.group, spec.line)
    holders[spec.field] = holder
  return holders


def values_of(cls: type, holders: dict[str, Any], **given: Any) -> Any:
  """`cls` of the flags' values (`holders`, as define_from returned them);
  `given` are the fields read elsewhere (another class's flag, or a value
  with a fallback)."""
  return cls(**{
      **{
          field: holder.value for field, holder in holders.items()
      },
      **given
  })


CONFIG = config_flags.DEFINE_config_file(
    'config',
    None,
    'Config file, PATH[:ARG]; --config.KEY=VALUE overrides.',
    lock_config=True)
usage.declare(CONFIG, usage.WHAT,
              "the job's config file; --config.FIELD=VALUE overrides")
WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Where the job writes; default workdirs/<config name>.')
usage.declare(WORKDIR, usage.WHAT,
              'where the job writes (default workdirs/<config>)')
LOCAL_DEVICES = flags.DEFINE_integer(
    'local_devices', None,
    'Run on this many emulated CPU devices per process, whatever the machine '
    'has. Default: the machine\'s devices (8 emulated ones for a single '
    'process without an accelerator); in a local pod, 8 // N each.')
usage.declare(LOCAL_DEVICES, usage.WHAT, 'emulated CPU devices per process')
LOCAL_PROCESSES = flags.DEFINE_integer(
    'local_processes', None,
    'Start a pod of N processes on this machine, joined by a coordinator on '
    '127.0.0.1, and supervise them.')
usage.declare(LOCAL_PROCESSES, usage.LOCAL_POD,
              'start and supervise N processes on 127.0.0.1')
# The flags declared on the fields that carry them (launcher/common/
# flag_spec.py): {field: FlagHolder} of each class.
COORDINATOR = define_from(process_flags.CoordinatorFlags)
WATCH = define_from(process_flags.WatchFlags)
COMPILATION_CACHE_DIR = flags.DEFINE_string(
    'compilation_cache_dir', None,
    'JAX\'s persistent compilation cache, which every attempt of the job '
    'must reach; default WORKDIR/compilation_cache, \'\' turns it off.')
usage.declare(COMPILATION_CACHE_DIR, usage.SUPERVISION,
              "JAX's persistent compilation cache")
POD_TIMEOUTS = define_from(monitor.Timeouts)
# --max_restarts, --restart_backoff, --retry_exit_codes: as every launcher
# declares them (the codes added to config.retry_exit_codes).
RESTART = restart_flags.define_absl(flags, __name__, 'Local pod: ')
usage.declare(RESTART['max_restarts'], usage.RESTARTS,
              'restart the job up to N times, resuming')
usage.declare(RESTART['restart_backoff'], usage.RESTARTS,
              'seconds before a restart after no progress')
usage.declare(RESTART['retry_exit_codes'], usage.RESTARTS,
              'exit codes to retry besides 75 (preempted)')
MIN_PROCESSES = flags.DEFINE_integer(
    'min_processes', None,
    'Local pod, elastic: a process lost (SIGKILL, or a --retry_exit_codes '
    'code) is taken for a lost host, and the job starts again at once on '
    'the others, the same global batch on fewer devices, while at least '
    'this many are left; it grows back after --regrow_after seconds. '
    'Shrinks and growths do not use --max_restarts. On processes started '
    'by hand: the fewest their scheduler may start again, every count '
    'from it up checked before step 1.')
usage.declare(MIN_PROCESSES, usage.RESTARTS,
              'elastic: go on with K or more after a lost one')
MIN_REPLICAS = flags.DEFINE_integer(
    'min_replicas', None,
    'Elastic: --min_processes counted in replicas. Each process '
    'is a replica: with replicated state, and with config.state_layout='
    '\'sharded\' under config.replica=\'process\', where a lost process '
    'takes its replica whole and the others go on with every shard. Give '
    'one of the two. On processes started by hand (their scheduler starts '
    'them again): every count from it up is checked before step 1.')
usage.declare(MIN_REPLICAS, usage.RESTARTS,
              'elastic: go on with K replicas or more (a process each)')
REGROW_AFTER = flags.DEFINE_float(
    'regrow_after', 60,
    'Local pod, elastic: seconds after a process is lost until it is back '
    '(the stand-in for a replacement host); the running attempt then '
    'saves at a step boundary, as on a preemption, and the job starts '
    'again on every process.')
usage.declare(REGROW_AFTER, usage.RESTARTS,
              'elastic: seconds until a lost process is back')
DRY_RUN = flags.DEFINE_bool(
    'dry_run', False, 'Print what each process would run, and start nothing.')
usage.declare(DRY_RUN, usage.WHAT,
              'print what each process would run; start nothing')
LOG_ALL_RANKS = flags.DEFINE_bool(
    'log_all_ranks', False, 'Show INFO logs of every rank, not only rank 0.')
usage.declare(LOG_ALL_RANKS, usage.WHAT,
              "show every rank's INFO lines, not only rank 0's")

GPU = define_from(gpus.GpuPolicy)

# Flags that a local pod sets for its ranks itself: those its own flags
# name, and those the typed fields say it sets.
POD_FLAGS = ('local_processes', 'workdir', 'local_devices', 'dry_run', *RESTART,
             'min_processes', 'min_replicas', 'regrow_after',
             *(spec.name
               for cls in (process_flags.CoordinatorFlags,
                           process_flags.WatchFlags, monitor.Timeouts)
               for spec in flag_spec.specs(cls)
               if spec.pod_sets))
