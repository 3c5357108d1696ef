"""The launcher's flags (`python -m launcher`), each defined once with its
line in the usage text (launcher/usage.py); launcher/cli.py reads them.

Example:
  >>> cli_flags.WORKDIR.value
  'workdirs/mnist'
"""

from absl import flags
from ml_collections import config_flags

from launcher import restart_flags
from launcher import tls
from launcher import usage
from launcher.common import cluster
from runtime.common import handoff

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
COORDINATOR_ADDRESS = flags.DEFINE_string(
    'coordinator_address', None,
    'HOST:PORT of process 0\'s coordinator. With --local_processes: the '
    'loopback port to use instead of a free one.')
usage.declare(COORDINATOR_ADDRESS, usage.LOCAL_POD,
              'HOST:PORT of process 0 (a local pod: the port)')
NUM_PROCESSES = flags.DEFINE_integer('num_processes', None,
                                     'Processes in the job.')
usage.declare(NUM_PROCESSES, usage.CLUSTER,
              'processes in the job (else detected)')
PROCESS_ID = flags.DEFINE_integer('process_id', None,
                                  'This process, in [0, num_processes).')
usage.declare(PROCESS_ID, usage.CLUSTER, 'this process, in [0, num_processes)')
CLUSTER = flags.DEFINE_enum(
    'cluster', 'auto', cluster.CHOICES,
    'auto: join the cluster the environment names (SLURM, Open MPI, '
    'Kubernetes, a TPU slice whose metadata server names several workers), '
    'else run one process on all of this host\'s devices; none: run one '
    'process alone, whatever the environment says.')
usage.declare(CLUSTER, usage.CLUSTER,
              'auto: join the cluster found, else run alone; none: alone')
COORDINATOR_BIND_ADDRESS = flags.DEFINE_string(
    'coordinator_bind_address', None,
    'HOST:PORT the coordinator listens on; default every interface.')
usage.declare(COORDINATOR_BIND_ADDRESS, usage.CLUSTER,
              'HOST:PORT process 0 listens on')
TLS = flags.DEFINE_enum(
    'tls', tls.AUTO, tls.MODES,
    'Mutual TLS on the coordinator (JAX 0.12 and newer): auto uses it where '
    'JAX has it (a local pod makes its own authority; a cluster\'s job needs '
    '--tls_dir) and says so where not; require refuses to start without it; '
    'off joins without it (docs/trust.md).')
usage.declare(TLS, usage.TRUST,
              'auto, require or off: mutual TLS on the coordinator')
TLS_DIR = flags.DEFINE_string(
    'tls_dir', None,
    'The job\'s certificate authority (`podrun-tls DIR` makes one), on a '
    f'path every host reads; default ${handoff.variable("tls_dir")}.')
usage.declare(TLS_DIR, usage.TRUST,
              "the job's certificate authority (podrun-tls DIR)")
INITIALIZATION_TIMEOUT = flags.DEFINE_integer(
    'initialization_timeout', 300,
    'Seconds to wait for every process to join the job.')
usage.declare(INITIALIZATION_TIMEOUT, usage.CLUSTER,
              'seconds for every process to join')
HEARTBEAT_TIMEOUT = flags.DEFINE_float(
    'heartbeat_timeout', 15,
    'Seconds without a heartbeat after which a process of the job is taken '
    'for lost: every other process names it and exits 10.')
usage.declare(HEARTBEAT_TIMEOUT, usage.SUPERVISION,
              'seconds of silence before a process is lost')
STALL_TIMEOUT = flags.DEFINE_float(
    'stall_timeout', 600,
    'Every rank: end the job (stacks dumped, exit 124) when no step completes '
    'for this many seconds after the first step; 0 disables. The ceiling of '
    'the learned deadline (--learned_stall_deadline).')
usage.declare(STALL_TIMEOUT, usage.SUPERVISION,
              'ceiling, in seconds, between two steps')
LEARNED_STALL_DEADLINE = flags.DEFINE_bool(
    'learned_stall_deadline', True,
    'Every rank: end the job as stalled sooner than --stall_timeout when no '
    'step completes within a deadline bounded by the run\'s own pace: in '
    'the first 20 steps max(--stall_floor, 3 x the longest of the first '
    'step, a step or a compilation seen), then max(--stall_floor, 10 x the '
    'p99 interval between steps, 3 x the longest interval or compilation '
    'seen), allowing 3 x the longest save or evaluation seen while one runs '
    '(launcher/process/stall.py). Kept in WORKDIR/stall for the next attempt. '
    'False: --stall_timeout is the deadline.')
usage.declare(LEARNED_STALL_DEADLINE, usage.SUPERVISION,
              "a deadline learned from the run's pace")
STALL_FLOOR = flags.DEFINE_float(
    'stall_floor', 10,
    'Every rank: the shortest deadline --learned_stall_deadline may learn, '
    'in seconds; with several processes at least --heartbeat_timeout + 2.')
usage.declare(STALL_FLOOR, usage.SUPERVISION,
              'the shortest deadline it may learn, in seconds')
FIRST_STEP_TIMEOUT = flags.DEFINE_float(
    'first_step_timeout', 1800,
    'Every rank: end the job (stacks dumped, exit 124) when the first step '
    '(start-up and compilation) does not complete within this many seconds; '
    '0 disables.')
usage.declare(FIRST_STEP_TIMEOUT, usage.SUPERVISION,
              'seconds for start-up and the first step')
BARRIER_TIMEOUT = flags.DEFINE_float(
    'barrier_timeout', 300,
    'Seconds any cross-process wait (checkpoint directory check, preemption '
    'save, end of run, shutdown) may take before it names the missing '
    'ranks and exits 124.')
usage.declare(BARRIER_TIMEOUT, usage.SUPERVISION,
              'seconds any cross-process wait may take')
SUPERVISION = flags.DEFINE_bool(
    'supervision', True,
    'Every rank watches the job through the coordination service: failure '
    'broadcast, lost processes, the hang watchdog, stragglers, the workdir '
    'lease. --nosupervision turns it off (for measuring its cost).')
usage.declare(SUPERVISION, usage.SUPERVISION,
              'failure broadcast, watchdog, stragglers, lease')
COMPILATION_CACHE_DIR = flags.DEFINE_string(
    'compilation_cache_dir', None,
    'JAX\'s persistent compilation cache, which every attempt of the job '
    'must reach; default WORKDIR/compilation_cache, \'\' turns it off.')
usage.declare(COMPILATION_CACHE_DIR, usage.SUPERVISION,
              "JAX's persistent compilation cache")
LEASE_TIMEOUT = flags.DEFINE_float(
    'lease_timeout', 60,
    'Seconds after which another job\'s lease on the workdir, not renewed '
    'since, is taken for the lease of a dead job and taken over.')
usage.declare(LEASE_TIMEOUT, usage.SUPERVISION,
              "seconds before a silent job's workdir lease lapses")
KILL_GRACE = flags.DEFINE_float(
    'kill_grace', 5,
    'Local pod: seconds between the SIGINT that stops the other ranks after '
    'a failure (or the signal forwarded from a Ctrl-C) and SIGKILL.')
usage.declare(KILL_GRACE, usage.LOCAL_POD,
              'seconds from the SIGINT that stops the ranks to SIGKILL')
PREEMPTION_GRACE = flags.DEFINE_float(
    'preemption_grace', 120,
    'Local pod: seconds the ranks get, after a preemption notice, to save a '
    'checkpoint and exit before they are killed.')
usage.declare(PREEMPTION_GRACE, usage.LOCAL_POD,
              'seconds to save after a preemption notice')
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

GPU_MEMORY_FRACTION = flags.DEFINE_float(
    'gpu_memory_fraction', None,
    'On a GPU host: the share of each GPU a process preallocates, set as '
    'XLA_CLIENT_MEM_FRACTION. Default: JAX\'s own (0.75), or what the '
    'environment says.')
usage.declare(GPU_MEMORY_FRACTION, usage.WHAT,
              'GPU: the share of each GPU a process preallocates')
GPU_PRESET = flags.DEFINE_bool(
    'gpu_preset', True,
    'On a GPU host: set the field\'s preset, XLA\'s latency-hiding '
    'scheduler and on Hopper CUDA_DEVICE_MAX_CONNECTIONS=1; a flag or '
    'variable already set wins.')
usage.declare(GPU_PRESET, usage.WHAT,
              "GPU: the field's XLA preset (on by default)")

# Flags that a local pod sets for its ranks itself.
POD_FLAGS = ('local_processes', 'coordinator_address', 'num_processes',
             'process_id', 'coordinator_bind_address', 'workdir',
             'local_devices', 'dry_run', 'max_restarts', 'restart_backoff',
             'retry_exit_codes', 'preemption_grace', 'min_processes',
             'min_replicas', 'regrow_after', 'tls', 'tls_dir', 'cluster')
