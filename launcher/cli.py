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
from typing import Any, NoReturn, Optional

from absl import app
from absl import flags
from ml_collections import ConfigDict
from ml_collections import config_flags

from launcher.local import elastic
from launcher.local import monitor
from launcher.local import pod as local_pod
from launcher import agent
from launcher import cli_flags
from launcher import config_errors
from launcher import restart
from launcher import restart_flags
from launcher import tls
from launcher import usage
from launcher.common import cluster
from launcher.common import gpus
from launcher.common import process_flags
from launcher.common import launcher_record
from launcher.common import output_prefix
from launcher.common import record_mirror
from launcher.common import workload
from runtime.common import elastic_replicas
from runtime.common import exit_codes
from runtime.common import version
from runtime.common import handoff
from runtime.common import layout


def _fail(message: str) -> NoReturn:
  """Ends the launcher with CONFIG_ERROR (see `run`)."""
  raise exit_codes.ConfigError(message)


def parse_flags(argv: list[str]) -> list[str]:
  """Parses flags and the config, turning any mistake into one error line.

  --help prints the launcher's flags by group (launcher/usage.py) and exits 0.
  """
  if '--version' in argv[1:]:
    print(version.line('podrun'), flush=True)
    sys.exit(0)
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
  if cli_flags.CONFIG.value is None:
    _fail('--config is required, for example '
          '--config=configs/linear_regression.py')
  filename = _config_filename()
  path = filename.split(':')[0]
  if not os.path.isfile(path):
    _fail(f'--config={filename}: no such file {path!r} (from '
          f'{os.getcwd()}); the configs are in configs/, for example '
          '--config=configs/linear_regression.py')
  try:
    config = cli_flags.CONFIG.value
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
    base = name[2:] if name.startswith(
        'no') and name[2:] in cli_flags.POD_FLAGS else name
    if base in cli_flags.POD_FLAGS:
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
    values[flag] = (flags.FLAGS[flag].value if flags.FLAGS[flag].present else
                    from_env.get(flag, (flags.FLAGS[flag].value,))[0])
  return cli_flags.values_of(
      distributed.CoordinatorFlags,
      cli_flags.COORDINATOR,
      **values,
      heartbeat_timeout=cli_flags.WATCH['heartbeat_timeout'].value,
      barrier_timeout=cli_flags.WATCH['barrier_timeout'].value,
      tls_dir=_tls_dir())


def _tls_dir() -> Optional[str]:
  """--tls_dir, else $PODRUN_TLS_DIR (a TPU driver sets it, as ~/...)."""
  found = cli_flags.COORDINATOR['tls_dir'].value or handoff.current().tls_dir
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
  told_devices = (cli_flags.LOCAL_DEVICES.value or
                  topology.get('local_devices'))
  local_devices = told_devices or max(1, 8 // max(_local_processes(), 1))
  # A GPU host's pod: each process drives its own GPUs, unless emulated
  # CPU devices are asked for.
  host_gpus = () if told_devices else tuple(gpus.find())
  return local_pod.PodSpec(
      local_devices=local_devices,
      workdir=workdir,
      process_args=tuple(
          pod_passthrough_args(sys.argv[1:]) + authority.process_args()),
      coordinator_address=cli_flags.COORDINATOR['coordinator_address'].value,
      timeouts=cli_flags.values_of(
          monitor.Timeouts,
          cli_flags.POD_TIMEOUTS,
          stall=cli_flags.WATCH['stall_timeout'].value,
          first_step=cli_flags.WATCH['first_step_timeout'].value),
      log_all_ranks=cli_flags.LOG_ALL_RANKS.value,
      elastic_processes=((capacity.minimum,
                          capacity.full) if capacity else None),
      attempts_may_follow=bool(capacity) or restarts.max_restarts > 0,
      restarts=restarts,
      gpus=host_gpus)


def _make_pod(spec: local_pod.PodSpec,
              job_id: str,
              start: Optional[agent.Start] = None,
              capacity: Optional[elastic.Capacity] = None) -> local_pod.Gang:
  """One attempt's local pod, as the agent `start`s it (None: the first's
  plan, for --dry_run); `capacity`: how many of its processes an elastic
  pod has now."""
  try:
    return local_pod.Gang(
        spec,
        num_processes=(capacity.running() if capacity else _local_processes()),
        job_id=job_id,
        attempt=start.number if start else 1,
        should_grow=start.should_grow if start else lambda now: False)
  except ValueError as e:
    _fail(str(e))


def _capacity(config: ConfigDict) -> Optional[elastic.Capacity]:
  """The processes of an elastic local pod (--min_processes, or
  --min_replicas, which counts the same processes), or None."""
  given = [(f'--{holder.name}', holder.value)
           for holder in (cli_flags.MIN_PROCESSES, cli_flags.MIN_REPLICAS)
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
  refused = elastic_replicas.refusal(config.get('state_layout') or '',
                                     config.get('replica') or 'process',
                                     (minimum, _local_processes()),
                                     why=f'{flag}={minimum}')
  if refused:
    _fail(refused)
  try:
    return elastic.Capacity(full=_local_processes(),
                            minimum=minimum,
                            regrow_after_s=cli_flags.REGROW_AFTER.value,
                            flag=flag)
  except ValueError as e:
    _fail(str(e))


def _local_processes() -> int:
  """--local_processes, on the paths that run the local pod (it is set)."""
  count = cli_flags.LOCAL_PROCESSES.value
  assert count is not None  # main takes the local pod's path on it alone.
  return count


def _config_filename() -> str:
  """--config's file (with any ':arguments'): config_flags' flag keeps it,
  on a Flag subclass absl's annotations do not know."""
  flag: Any = flags.FLAGS['config']
  return flag.config_filename


def _restarts(config: ConfigDict) -> restart.RestartPolicy:
  """--max_restarts, --restart_backoff, and the exit codes retried
  (--retry_exit_codes with config.retry_exit_codes)."""
  from_config = list(config.get('retry_exit_codes', ()) or ())
  try:
    given: dict[str, Any] = {
        name: cli_flags.RESTART[name].value for name, *_ in restart_flags.FLAGS
    }
    return restart_flags.policy_of(**given, more_codes=from_config)
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


def _launcher_mirror(record: layout.Record,
                     job_id: str) -> Optional[record_mirror.Mirror]:
  """For a bucket's record, the launcher's part of it (the attempts, the
  goodput roll-up), after it fetched the earlier attempts' into this
  machine's copy, made job `job_id`'s."""
  if not record.bucket:
    return None
  mirror = record_mirror.Mirror(record.bucket,
                                record.workdir,
                                owns=record_mirror.launcher_owns,
                                job_id=job_id)
  try:
    mirror.fetch()
  except Exception as e:  # pylint: disable=broad-except
    _fail(f'--workdir={record.bucket}: cannot read the bucket: {e}')
  return mirror


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]}; flags take the form --name=value')
  output_prefix.quiet_routine_logs()
  config = cli_flags.CONFIG.value
  workdir = _workdir(cli_flags.WORKDIR.value)
  workload.parse(config.get('workload'))

  tls.check_required(cli_flags.COORDINATOR['tls'].value)
  if cli_flags.LOCAL_PROCESSES.value is not None:
    return _run_local_pod(config, workdir)
  return _run_process(config, workdir)


def _run_local_pod(config: ConfigDict, workdir: str) -> int:
  """--local_processes: the pod, restarted and resized as its flags say."""
  capacity = _capacity(config)
  job_id = uuid.uuid4().hex
  authority = tls.PodAuthority(cli_flags.COORDINATOR['tls'].value, job_id,
                               restart.console_say)
  record = layout.Record.of(workdir)
  try:
    # Before the pod: a copy set aside takes its directory with it.
    mirror = None if cli_flags.DRY_RUN.value else _launcher_mirror(
        record, job_id)
    spec = _pod_spec(config, workdir, authority, capacity)
    if cli_flags.DRY_RUN.value:
      return _make_pod(spec, job_id=job_id, capacity=capacity).print_plan()

    def finish(code: int) -> None:
      # The pod's launcher mirrors a bucket's record itself (its copy is
      # where the ranks write): the goodput is rolled up in that copy, then
      # uploaded.
      authority.close()
      launcher_record.finish(record,
                             record.attempts(),
                             None,
                             restart.console_say,
                             shown=workdir)
      if mirror is not None:
        mirror.finish()

    return agent.run(
        agent.Job(start=lambda start: _make_pod(
            spec, job_id=job_id, start=start, capacity=capacity),
                  restarts=spec.restarts,
                  logs_dir=record.logs(),
                  capacity=capacity,
                  elastic=capacity is not None,
                  finish=finish))
  finally:
    authority.close()


def _fewest() -> Optional[int]:
  """--min_processes or --min_replicas for processes started by hand: the
  fewest the job may run on again (its scheduler starts them); None."""
  given = [(f'--{holder.name}', holder.value)
           for holder in (cli_flags.MIN_PROCESSES, cli_flags.MIN_REPLICAS)
           if holder.value is not None]
  if len(given) > 1:
    _fail('--min_processes and --min_replicas count the same processes '
          'here: give one of them')
  if cli_flags.REGROW_AFTER.present:
    _fail('--regrow_after needs --local_processes: processes started by '
          'hand are started again by their scheduler, on the count it has')
  return given[0][1] if given else None


def _run_process(config: ConfigDict, workdir: str) -> int:
  """Without --local_processes: this process is one of the job's."""
  fewest = _fewest()
  if cli_flags.RESTART['max_restarts'].value:
    _fail('--max_restarts needs --local_processes: on a cluster every host '
          'must restart together, which is the scheduler\'s job (for example '
          'SLURM --requeue, a Kubernetes Job\'s backoffLimit); the job then '
          'resumes from its checkpoint by itself. On one machine use '
          '--local_processes=1 or more.')

  if cli_flags.DRY_RUN.value:
    from launcher.process import dry_run  # pylint: disable=g-import-not-at-top
    return dry_run.print_plan(sys.argv, distributed_options(),
                              cli_flags.LOCAL_DEVICES.value)
  from launcher.process import job  # pylint: disable=g-import-not-at-top
  return job.run(
      config, workdir,
      job.ProcessFlags(
          distributed=distributed_options(),
          config_file=_config_filename().split(':')[0],
          local_devices=cli_flags.LOCAL_DEVICES.value,
          log_all_ranks=cli_flags.LOG_ALL_RANKS.value,
          gpu=cli_flags.values_of(gpus.GpuPolicy, cli_flags.GPU),
          supervision=cli_flags.values_of(process_flags.WatchFlags,
                                          cli_flags.WATCH),
          compilation_cache_dir=cli_flags.COMPILATION_CACHE_DIR.value,
          min_processes=fewest))


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
    print(f'podrun: error: {e}', file=sys.stderr)
    sys.exit(e.exit_code)
