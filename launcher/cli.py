"""The launcher's command line.

  python -m launcher --config=configs/linear_regression.py [--workdir=DIR]
  python -m launcher --config=configs/mlp.py --local_processes=2 --local_devices=4

Without --local_processes the job runs in this process, which joins a
multi-process job when the coordinator flags are given or the cluster is one
JAX detects. With --local_processes=N the launcher starts and supervises a
pod of N such processes on this machine.
"""

import importlib.util
import os
import sys
import uuid
from typing import NoReturn, Optional

from absl import app
from absl import flags
from ml_collections import ConfigDict
from ml_collections import config_flags

from launcher.local import elastic
from launcher.local import monitor
from launcher.local import pod as local_pod
from launcher import agent
from launcher import config_errors
from launcher import elastic as policy
from launcher import restart
from launcher import restart_flags
from launcher import tls
from launcher import usage
from launcher.common import cluster
from launcher.common import launcher_record
from launcher.common import output_prefix
from launcher.common import record_mirror
from launcher.common import workload
from runtime.common import exit_codes
from runtime.common import handoff
from runtime.common import layout

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file, PATH[:ARG]; --config.KEY=VALUE overrides.',
    lock_config=True)
usage.declare(_CONFIG, usage.WHAT,
              "the job's config file; --config.FIELD=VALUE overrides")
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Where the job writes; default workdirs/<config name>.')
usage.declare(_WORKDIR, usage.WHAT,
              'where the job writes (default workdirs/<config>)')
_LOCAL_DEVICES = flags.DEFINE_integer(
    'local_devices', None,
    'Run on this many emulated CPU devices per process, whatever the machine '
    'has. Default: the machine\'s devices (8 emulated ones for a single '
    'process without an accelerator); in a local pod, 8 // N each.')
usage.declare(_LOCAL_DEVICES, usage.WHAT, 'emulated CPU devices per process')
_LOCAL_PROCESSES = flags.DEFINE_integer(
    'local_processes', None,
    'Start a pod of N processes on this machine, joined by a coordinator on '
    '127.0.0.1, and supervise them.')
usage.declare(_LOCAL_PROCESSES, usage.LOCAL_POD,
              'start and supervise N processes on 127.0.0.1')
_COORDINATOR_ADDRESS = flags.DEFINE_string(
    'coordinator_address', None,
    'HOST:PORT of process 0\'s coordinator. With --local_processes: the '
    'loopback port to use instead of a free one.')
usage.declare(_COORDINATOR_ADDRESS, usage.LOCAL_POD,
              'HOST:PORT of process 0 (a local pod: the port)')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None,
                                      'Processes in the job.')
usage.declare(_NUM_PROCESSES, usage.CLUSTER,
              'processes in the job (else detected)')
_PROCESS_ID = flags.DEFINE_integer('process_id', None,
                                   'This process, in [0, num_processes).')
usage.declare(_PROCESS_ID, usage.CLUSTER, 'this process, in [0, num_processes)')
_CLUSTER = flags.DEFINE_enum(
    'cluster', 'auto', cluster.CHOICES,
    'auto: join the cluster the environment names (SLURM, Open MPI, '
    'Kubernetes, a TPU slice whose metadata server names several workers), '
    'else run one process on all of this host\'s devices; none: run one '
    'process alone, whatever the environment says.')
usage.declare(_CLUSTER, usage.CLUSTER,
              'auto: join the cluster found, else run alone; none: alone')
_COORDINATOR_BIND_ADDRESS = flags.DEFINE_string(
    'coordinator_bind_address', None,
    'HOST:PORT the coordinator listens on; default every interface.')
usage.declare(_COORDINATOR_BIND_ADDRESS, usage.CLUSTER,
              'HOST:PORT process 0 listens on')
_TLS = flags.DEFINE_enum(
    'tls', tls.AUTO, tls.MODES,
    'Mutual TLS on the coordinator (JAX 0.12 and newer): auto uses it where '
    'JAX has it (a local pod makes its own authority; a cluster\'s job needs '
    '--tls_dir) and says so where not; require refuses to start without it; '
    'off joins without it (docs/trust.md).')
usage.declare(_TLS, usage.TRUST,
              'auto, require or off: mutual TLS on the coordinator')
_TLS_DIR = flags.DEFINE_string(
    'tls_dir', None,
    'The job\'s certificate authority (`podrun-tls DIR` makes one), on a '
    f'path every host reads; default ${handoff.variable("tls_dir")}.')
usage.declare(_TLS_DIR, usage.TRUST,
              "the job's certificate authority (podrun-tls DIR)")
_INITIALIZATION_TIMEOUT = flags.DEFINE_integer(
    'initialization_timeout', 300,
    'Seconds to wait for every process to join the job.')
usage.declare(_INITIALIZATION_TIMEOUT, usage.CLUSTER,
              'seconds for every process to join')
_HEARTBEAT_TIMEOUT = flags.DEFINE_float(
    'heartbeat_timeout', 15,
    'Seconds without a heartbeat after which a process of the job is taken '
    'for lost: every other process names it and exits 10.')
usage.declare(_HEARTBEAT_TIMEOUT, usage.SUPERVISION,
              'seconds of silence before a process is lost')
_STALL_TIMEOUT = flags.DEFINE_float(
    'stall_timeout', 600,
    'Every rank: end the job (stacks dumped, exit 124) when no step completes '
    'for this many seconds after the first step; 0 disables. The ceiling of '
    'the learned deadline (--learned_stall_deadline).')
usage.declare(_STALL_TIMEOUT, usage.SUPERVISION,
              'ceiling, in seconds, between two steps')
_LEARNED_STALL_DEADLINE = flags.DEFINE_bool(
    'learned_stall_deadline', True,
    'Every rank: end the job as stalled sooner than --stall_timeout when no '
    'step completes within a deadline bounded by the run\'s own pace: in '
    'the first 20 steps max(--stall_floor, 3 x the longest of the first '
    'step, a step or a compilation seen), then max(--stall_floor, 10 x the '
    'p99 interval between steps, 3 x the longest interval or compilation '
    'seen), allowing 3 x the longest save or evaluation seen while one runs '
    '(launcher/process/stall.py). Kept in WORKDIR/stall for the next attempt. '
    'False: --stall_timeout is the deadline.')
usage.declare(_LEARNED_STALL_DEADLINE, usage.SUPERVISION,
              "a deadline learned from the run's pace")
_STALL_FLOOR = flags.DEFINE_float(
    'stall_floor', 10,
    'Every rank: the shortest deadline --learned_stall_deadline may learn, '
    'in seconds; with several processes at least --heartbeat_timeout + 2.')
usage.declare(_STALL_FLOOR, usage.SUPERVISION,
              'the shortest deadline it may learn, in seconds')
_FIRST_STEP_TIMEOUT = flags.DEFINE_float(
    'first_step_timeout', 1800,
    'Every rank: end the job (stacks dumped, exit 124) when the first step '
    '(start-up and compilation) does not complete within this many seconds; '
    '0 disables.')
usage.declare(_FIRST_STEP_TIMEOUT, usage.SUPERVISION,
              'seconds for start-up and the first step')
_BARRIER_TIMEOUT = flags.DEFINE_float(
    'barrier_timeout', 300,
    'Seconds any cross-process wait (checkpoint directory check, preemption '
    'save, end of run, shutdown) may take before it names the missing '
    'ranks and exits 124.')
usage.declare(_BARRIER_TIMEOUT, usage.SUPERVISION,
              'seconds any cross-process wait may take')
_SUPERVISION = flags.DEFINE_bool(
    'supervision', True,
    'Every rank watches the job through the coordination service: failure '
    'broadcast, lost processes, the hang watchdog, stragglers, the workdir '
    'lease. --nosupervision turns it off (for measuring its cost).')
usage.declare(_SUPERVISION, usage.SUPERVISION,
              'failure broadcast, watchdog, stragglers, lease')
_COMPILATION_CACHE_DIR = flags.DEFINE_string(
    'compilation_cache_dir', None,
    'JAX\'s persistent compilation cache, which every attempt of the job '
    'must reach; default WORKDIR/compilation_cache, \'\' turns it off.')
usage.declare(_COMPILATION_CACHE_DIR, usage.SUPERVISION,
              "JAX's persistent compilation cache")
_LEASE_TIMEOUT = flags.DEFINE_float(
    'lease_timeout', 60,
    'Seconds after which another job\'s lease on the workdir, not renewed '
    'since, is taken for the lease of a dead job and taken over.')
usage.declare(_LEASE_TIMEOUT, usage.SUPERVISION,
              "seconds before a silent job's workdir lease lapses")
_KILL_GRACE = flags.DEFINE_float(
    'kill_grace', 5,
    'Local pod: seconds between the SIGINT that stops the other ranks after '
    'a failure (or the signal forwarded from a Ctrl-C) and SIGKILL.')
usage.declare(_KILL_GRACE, usage.LOCAL_POD,
              'seconds from the SIGINT that stops the ranks to SIGKILL')
_PREEMPTION_GRACE = flags.DEFINE_float(
    'preemption_grace', 120,
    'Local pod: seconds the ranks get, after a preemption notice, to save a '
    'checkpoint and exit before they are killed.')
usage.declare(_PREEMPTION_GRACE, usage.LOCAL_POD,
              'seconds to save after a preemption notice')
# --max_restarts, --restart_backoff, --retry_exit_codes: as every launcher
# declares them (the codes added to config.retry_exit_codes).
_RESTART = restart_flags.define_absl(flags, __name__, 'Local pod: ')
usage.declare(_RESTART['max_restarts'], usage.RESTARTS,
              'restart the job up to N times, resuming')
usage.declare(_RESTART['restart_backoff'], usage.RESTARTS,
              'seconds before a restart after no progress')
usage.declare(_RESTART['retry_exit_codes'], usage.RESTARTS,
              'exit codes to retry besides 75 (preempted)')
_MIN_PROCESSES = flags.DEFINE_integer(
    'min_processes', None,
    'Local pod, elastic: a process lost (SIGKILL, or a --retry_exit_codes '
    'code) is taken for a lost host, and the job starts again at once on '
    'the others, the same global batch on fewer devices, while at least '
    'this many are left; it grows back after --regrow_after seconds. '
    'Shrinks and growths do not use --max_restarts.')
usage.declare(_MIN_PROCESSES, usage.RESTARTS,
              'elastic: go on with K or more after a lost one')
_MIN_REPLICAS = flags.DEFINE_integer(
    'min_replicas', None,
    'Local pod, elastic: --min_processes counted in replicas. Each process '
    'is a replica: with replicated state, and with config.state_layout='
    '\'sharded\' under config.replica=\'process\', where a lost process '
    'takes its replica whole and the others go on with every shard. Give '
    'one of the two.')
usage.declare(_MIN_REPLICAS, usage.RESTARTS,
              'elastic: go on with K replicas or more (a process each)')
_REGROW_AFTER = flags.DEFINE_float(
    'regrow_after', 60,
    'Local pod, elastic: seconds after a process is lost until it is back '
    '(the stand-in for a replacement host); the running attempt then '
    'saves at a step boundary, as on a preemption, and the job starts '
    'again on every process.')
usage.declare(_REGROW_AFTER, usage.RESTARTS,
              'elastic: seconds until a lost process is back')
_DRY_RUN = flags.DEFINE_bool(
    'dry_run', False, 'Print what each process would run, and start nothing.')
usage.declare(_DRY_RUN, usage.WHAT,
              'print what each process would run; start nothing')
_LOG_ALL_RANKS = flags.DEFINE_bool(
    'log_all_ranks', False, 'Show INFO logs of every rank, not only rank 0.')
usage.declare(_LOG_ALL_RANKS, usage.WHAT,
              "show every rank's INFO lines, not only rank 0's")

# Flags that a local pod sets for its ranks itself.
POD_FLAGS = ('local_processes', 'coordinator_address', 'num_processes',
             'process_id', 'coordinator_bind_address', 'workdir',
             'local_devices', 'dry_run', 'max_restarts', 'restart_backoff',
             'retry_exit_codes', 'preemption_grace', 'min_processes',
             'min_replicas', 'regrow_after', 'tls', 'tls_dir', 'cluster')


def _fail(message: str) -> NoReturn:
  """Ends the launcher with CONFIG_ERROR (see `run`)."""
  raise exit_codes.ConfigError(message)


def parse_flags(argv: list[str]) -> list[str]:
  """Parses flags and the config, turning any mistake into one error line.

  --help prints the launcher's flags by group (launcher/usage.py) and exits 0.
  """
  if any(arg in usage.HELP_ARGS for arg in argv[1:]):
    try:
      print(usage.text(flags.FLAGS), flush=True)
    except BrokenPipeError:  # `podrun --help | head`
      pass
    sys.exit(0)
  try:
    rest = flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    clash = config_errors.section_clash(str(e))
    if clash:
      _fail(f'bad flags or config: {clash}')
    _fail(f'bad flags or config: {type(e).__name__}: '
          f'{config_errors.error_detail(e)}')
  if _CONFIG.value is None:
    _fail('--config is required, for example '
          '--config=configs/linear_regression.py')
  filename = flags.FLAGS['config'].config_filename
  path = filename.split(':')[0]
  if not os.path.isfile(path):
    _fail(f'--config={filename}: no such file {path!r} (from '
          f'{os.getcwd()}); the configs are in configs/, for example '
          '--config=configs/linear_regression.py')
  try:
    config = _CONFIG.value
    if not isinstance(config, ConfigDict):
      # ml_collections keeps the loading error; any access raises it.
      getattr(config, 'workload')
      raise TypeError(f'get_config() returned {type(config).__name__}')
  except Exception as e:  # pylint: disable=broad-except
    _fail(f'cannot load --config={filename}: {type(e).__name__}: {e}')
  return rest


def config_name() -> str:
  """'linear_regression' for --config=configs/linear_regression.py:ARG."""
  path = config_flags.get_config_filename(flags.FLAGS['config'])
  name = os.path.splitext(os.path.basename(path.split(':')[0]))[0]
  arg = path.partition(':')[2]
  return f'{name}_{arg}' if arg else name


def pod_passthrough_args(argv: list[str]) -> list[str]:
  """The command-line arguments a local pod hands on to each rank.

  Drops the flags the pod sets per rank, in both the `--flag=v` and the
  `--flag v` spelling.
  """
  out, skip_next = [], False
  for arg in argv:
    if skip_next:
      skip_next = False
      continue
    name = arg.lstrip('-').split('=', 1)[0] if arg.startswith('-') else ''
    base = name[2:] if name.startswith('no') and name[2:] in POD_FLAGS else name
    if base in POD_FLAGS:
      takes_value = not flags.FLAGS[base].boolean
      skip_next = takes_value and '=' not in arg
      continue
    out.append(arg)
  return out


def distributed_options():
  """The distributed flags, as a launcher.process.distributed.CoordinatorFlags;
  a flag not given falls back to PODRUN_* variables.

  See `cluster.explicit_options` for the variables. Only a launcher that is
  itself a process of the job asks for them, so launcher.process is imported
  here and not by the supervising side.
  """
  from launcher.process import distributed  # pylint: disable=g-import-not-at-top
  try:
    from_env = cluster.explicit_options()
  except cluster.ClusterEnvError as e:
    _fail(str(e))
  values = {}
  for flag in ('coordinator_address', 'num_processes', 'process_id',
               'coordinator_bind_address'):
    values[flag] = (flags.FLAGS[flag].value if flags.FLAGS[flag].present
                    else from_env.get(flag, (flags.FLAGS[flag].value,))[0])
  return distributed.CoordinatorFlags(
      **values,
      initialization_timeout=_INITIALIZATION_TIMEOUT.value,
      heartbeat_timeout=_HEARTBEAT_TIMEOUT.value,
      shutdown_timeout=_BARRIER_TIMEOUT.value,
      tls=_TLS.value,
      tls_dir=_tls_dir(),
      cluster=_CLUSTER.value)


def _tls_dir() -> Optional[str]:
  """--tls_dir, else $PODRUN_TLS_DIR (a TPU driver sets it, as ~/...)."""
  found = _TLS_DIR.value or handoff.current().tls_dir
  return os.path.expanduser(found) if found else None


def _pod_spec(config: ConfigDict, workdir: str, authority: tls.PodAuthority,
              capacity: Optional[elastic.Capacity]) -> local_pod.PodSpec:
  """What every attempt of the local pod that --local_processes asks for
  runs with, from the flags (`capacity`: an elastic pod's; `authority`:
  its TLS)."""
  for name in ('num_processes', 'process_id', 'coordinator_bind_address',
               'cluster'):
    if flags.FLAGS[name].present:
      _fail(f'--{name} is chosen by the launcher with --local_processes; '
            'drop it')
  restarts = _restarts(config)
  topology = config.get('topology') or {}
  # Each process keeps its devices when others are lost: a host's.
  local_devices = (_LOCAL_DEVICES.value or topology.get('local_devices') or
                   max(1, 8 // max(_LOCAL_PROCESSES.value, 1)))
  return local_pod.PodSpec(
      local_devices=local_devices, workdir=workdir,
      process_args=tuple(pod_passthrough_args(sys.argv[1:]) +
                         authority.process_args()),
      coordinator_address=_COORDINATOR_ADDRESS.value,
      timeouts=monitor.Timeouts(_STALL_TIMEOUT.value,
                                _FIRST_STEP_TIMEOUT.value,
                                _PREEMPTION_GRACE.value),
      kill_grace=_KILL_GRACE.value, log_all_ranks=_LOG_ALL_RANKS.value,
      elastic_processes=((capacity.minimum, capacity.full) if capacity
                         else None),
      attempts_may_follow=bool(capacity) or restarts.max_restarts > 0,
      restarts=restarts)


def _make_pod(spec: local_pod.PodSpec, job_id: str,
              start: Optional[agent.Start] = None,
              capacity: Optional[elastic.Capacity] = None) -> local_pod.Gang:
  """One attempt's local pod, as the agent `start`s it (None: the first's
  plan, for --dry_run); `capacity`: how many of its processes an elastic
  pod has now."""
  try:
    return local_pod.Gang(
        spec,
        num_processes=(capacity.running() if capacity
                       else _LOCAL_PROCESSES.value),
        job_id=job_id, attempt=start.number if start else 1,
        should_grow=start.should_grow if start else lambda now: False)
  except ValueError as e:
    _fail(str(e))


def _capacity(config: ConfigDict) -> Optional[elastic.Capacity]:
  """The processes of an elastic local pod (--min_processes, or
  --min_replicas, which counts the same processes), or None."""
  given = [(f'--{holder.name}', holder.value)
           for holder in (_MIN_PROCESSES, _MIN_REPLICAS)
           if holder.value is not None]
  if not given:
    return None
  if len(given) > 1:
    _fail('--min_processes and --min_replicas count the same processes '
          'here: give one of them')
  flag, minimum = given[0]
  fixed = (config.get('topology') or {}).get('num_processes')
  if fixed is not None:
    _fail(f'config.topology.num_processes={fixed} fixes the process count, '
          f'and {flag}={minimum} lets it change: unset one of them')
  replica = config.get('replica') or 'process'
  if config.get('state_layout') == 'sharded' and replica != 'process':
    _fail(f"{flag}={minimum} with config.state_layout='sharded' and "
          f'config.replica={replica!r}: a replica of several processes is '
          "lost with any of them; set config.replica='process' (each "
          'process a replica)')
  try:
    return elastic.Capacity(full=_LOCAL_PROCESSES.value, minimum=minimum,
                            regrow_after_s=_REGROW_AFTER.value, flag=flag)
  except ValueError as e:
    _fail(str(e))


def _restarts(config: ConfigDict) -> restart.RestartPolicy:
  """--max_restarts, --restart_backoff, and the exit codes retried
  (--retry_exit_codes with config.retry_exit_codes)."""
  from_config = list(config.get('retry_exit_codes', ()) or ())
  try:
    return restart_flags.policy_of(
        *(_RESTART[name].value for name, *_ in restart_flags.FLAGS),
        more_codes=from_config)
  except ValueError as e:
    _fail(f'{e}' + (f' (with config.retry_exit_codes={from_config})'
                    if from_config else ''))


def _workdir(flag: Optional[str]) -> str:
  """The job's workdir: an absolute local path, or a gs:// URL (never taken
  for a relative path named 'gs:')."""
  if flag and layout.in_bucket(flag):
    if not flag[len('gs://'):].strip('/'):
      _fail(f'--workdir={flag}: name the bucket, as gs://BUCKET/RUN')
    if importlib.util.find_spec('gcsfs') is None:
      _fail(f'--workdir={flag}: a workdir in a bucket needs gcsfs, which is '
            'not installed: pip install -e ".[gcs]" (the tpu extra has it)')
    return flag.rstrip('/')
  if flag and '://' in flag:
    _fail(f'--workdir={flag}: a workdir is a local or shared directory or a '
          'gs:// bucket; no other storage is supported')
  return os.path.abspath(flag or os.path.join('workdirs', config_name()))


def _launcher_mirror(workdir: str, job_id: str
                     ) -> Optional[record_mirror.Mirror]:
  """For a bucket's workdir, the launcher's part of the record (the
  attempts, the goodput roll-up), after it fetched the earlier attempts'
  into this machine's copy, made job `job_id`'s."""
  record = layout.Record.of(workdir)
  if not record.bucket:
    return None
  mirror = record_mirror.Mirror(record.bucket, record.workdir,
                                owns=record_mirror.launcher_owns,
                                job_id=job_id)
  try:
    mirror.fetch()
  except Exception as e:  # pylint: disable=broad-except
    _fail(f'--workdir={workdir}: cannot read the bucket: {e}')
  return mirror


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]}; flags take the form --name=value')
  output_prefix.quiet_routine_logs()
  config = _CONFIG.value
  workdir = _workdir(_WORKDIR.value)
  workload.parse(config.get('workload'))

  tls.check_required(_TLS.value)
  if _LOCAL_PROCESSES.value is not None:
    return _run_local_pod(config, workdir)
  return _run_process(config, workdir)


def _run_local_pod(config: ConfigDict, workdir: str) -> int:
  """--local_processes: the pod, restarted and resized as its flags say."""
  capacity = _capacity(config)
  job_id = uuid.uuid4().hex
  authority = tls.PodAuthority(_TLS.value, job_id, restart.console_say)
  try:
    # Before the pod: a copy set aside takes its directory with it.
    mirror = None if _DRY_RUN.value else _launcher_mirror(workdir, job_id)
    spec = _pod_spec(config, workdir, authority, capacity)
    if _DRY_RUN.value:
      return _make_pod(spec, job_id=job_id, capacity=capacity).print_plan()

    def finish(code: int) -> None:
      # The pod's launcher mirrors a bucket's record itself (its copy is
      # where the ranks write): the goodput is rolled up in that copy, then
      # uploaded.
      authority.close()
      launcher_record.finish(
          layout.Record(workdir if mirror is None else mirror.local_dir),
          layout.Record(workdir).attempts(), None, restart.console_say,
          shown=workdir)
      if mirror is not None:
        mirror.finish()
    return agent.run(agent.Job(
        start=lambda start: _make_pod(spec, job_id=job_id, start=start,
                                      capacity=capacity),
        restarts=spec.restarts, logs_dir=layout.Record.of(workdir).logs(),
        capacity=capacity,
        resize=(policy.Policy(capacity, restart.console_say).after
                if capacity else None),
        finish=finish))
  finally:
    authority.close()


def _run_process(config: ConfigDict, workdir: str) -> int:
  """Without --local_processes: this process is one of the job's."""
  for holder in (_MIN_PROCESSES, _MIN_REPLICAS):
    if holder.value is not None:
      _fail(f'--{holder.name} needs --local_processes; a cluster\'s job '
            'started on fewer processes resumes by itself (docs/elastic.md)')
  if _RESTART['max_restarts'].value:
    _fail('--max_restarts needs --local_processes: on a cluster every host '
          'must restart together, which is the scheduler\'s job (for example '
          'SLURM --requeue, a Kubernetes Job\'s backoffLimit); the job then '
          'resumes from its checkpoint by itself. On one machine use '
          '--local_processes=1 or more.')

  if _DRY_RUN.value:
    from launcher.process import dry_run  # pylint: disable=g-import-not-at-top
    return dry_run.print_plan(sys.argv, distributed_options(),
                              _LOCAL_DEVICES.value)
  from launcher.process import job  # pylint: disable=g-import-not-at-top
  from launcher.process import supervisor  # pylint: disable=g-import-not-at-top
  return job.run(config, workdir, job.ProcessFlags(
      distributed=distributed_options(),
      config_file=flags.FLAGS['config'].config_filename.split(':')[0],
      local_devices=_LOCAL_DEVICES.value,
      log_all_ranks=_LOG_ALL_RANKS.value,
      supervision=supervisor.WatchFlags(
          heartbeat_timeout=_HEARTBEAT_TIMEOUT.value,
          stall_timeout=_STALL_TIMEOUT.value,
          first_step_timeout=_FIRST_STEP_TIMEOUT.value,
          barrier_timeout=_BARRIER_TIMEOUT.value,
          enabled=_SUPERVISION.value,
          learned_stall_deadline=_LEARNED_STALL_DEADLINE.value,
          stall_floor=_STALL_FLOOR.value),
      lease_timeout=_LEASE_TIMEOUT.value,
      compilation_cache_dir=_COMPILATION_CACHE_DIR.value))


def run() -> NoReturn:
  """`python -m launcher`: flags, then `main`; a ConfigError from either is
  one line and exit code 2, never a traceback."""
  # The config file's own imports (`from configs import default`) find the
  # project's packages first, as `python -m` would: the `podrun` command
  # starts with its bin/ directory there instead.
  if os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    app.run(main, flags_parser=parse_flags)
  except exit_codes.ConfigError as e:
    print(f'launcher: error: {e}', file=sys.stderr)
    sys.exit(e.exit_code)
