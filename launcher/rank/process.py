"""Running the job in this process: devices, jax.distributed, supervision,
the topology check, the workdir lease, then the workload.

This is what every rank runs, whether a cluster started it (one process per
host) or a local-pod launcher did. The order matters: device options and
jax.distributed must be settled before anything initialises JAX's backend, and
the workload is imported only afterwards.
"""

import dataclasses
import faulthandler
import os
import shlex
import signal
import sys
import time
import traceback
import uuid
from typing import Any, NoReturn, Optional

from absl import logging
from ml_collections import ConfigDict

from launcher.rank import compilation
from launcher.rank import devices
from launcher.rank import distributed
from launcher.rank import interrupt
from launcher.rank import lease as lease_lib
from launcher.rank import peers as peers_lib
from launcher.rank import roll_call
from launcher.rank import supervisor as supervisor_lib
from runtime import agreement
from runtime import checkpoint
from runtime.common import accelerators
from runtime.common import cluster
from runtime.common import env_vars
from runtime.common import exit_codes
from runtime.common import goodput
from runtime.common import output_prefix
from runtime.common import workload
from runtime import coordination
from runtime import metrics
from runtime import topology

# How long the main thread has to stop by itself after SIGINT before the
# process exits anyway (launcher/rank/interrupt.py).
_INTERRUPT_GRACE_S = 0.5
# Set by the TPU pod driver on every worker: how many processes must join.


@dataclasses.dataclass(frozen=True)
class Options:
  """How this process joins the job and is supervised.

  Attributes:
    distributed: the coordinator flags.
    local_devices: --local_devices, emulated CPU devices for this process.
    log_all_ranks: show INFO logs of every rank, not only of rank 0.
    supervision: heartbeat, stall and barrier timeouts (supervisor.py).
    lease_timeout: seconds after which another job's unrenewed lease on the
      workdir is taken over (lease.py).
    compilation_cache_dir: JAX's persistent compilation cache; None means
      WORKDIR/compilation_cache, '' none.
  """
  distributed: distributed.Options
  local_devices: Optional[int] = None
  log_all_ranks: bool = False
  supervision: supervisor_lib.Options = supervisor_lib.Options()
  lease_timeout: float = 60
  compilation_cache_dir: Optional[str] = None


@dataclasses.dataclass
class _Running:
  """What the failure path needs of a run in progress."""
  supervisor: Optional[supervisor_lib.Supervisor] = None
  lease: Optional[lease_lib.Lease] = None
  ledger: goodput.Ledger = dataclasses.field(default_factory=goodput.Ledger)


def _terminate(signum, frame) -> NoReturn:
  del frame
  # Unwind the stack so `finally` blocks run; the launcher kills what stays.
  raise SystemExit(exit_codes.SIGNAL_BASE + signum)


def _summary(config: ConfigDict, topo: topology.Topology, results: Any,
             ranks: list[dict[str, Any]]) -> dict[str, Any]:
  """summary.json; results are a workload's TrainResult or its own dict."""
  if hasattr(results, 'summary'):
    final_metrics, results = results.final_metrics, results.summary()
  else:
    results = dict(results or {})
    final_metrics = results.pop('final_metrics', None)
  return {
      'workload': config.workload,
      'steps': config.get('steps'),
      'global_batch_size': config.get('global_batch_size'),
      'process_count': topo.process_count,
      'device_count': topo.global_device_count,
      'local_device_count': topo.local_device_count,
      'platform': topo.platform,
      'device_kind': topo.device_kind,
      'final_metrics': final_metrics,
      'ranks': ranks,
      'results': results,
  }


def _implied_by_accelerator(config: ConfigDict) -> list[topology.Expectation]:
  """What config.topology.accelerator_type says of the pod, if it is set."""
  name = (config.get('topology') or {}).get('accelerator_type')
  if not name:
    return []
  try:
    slice_ = accelerators.slice_topology(name)
  except accelerators.AcceleratorTypeError as e:
    raise workload.ConfigError(f'config.topology.accelerator_type: {e}')
  source = f'config.topology.accelerator_type={name}'
  slices = config.topology.get('num_slices')
  if slices:
    source += f' x config.topology.num_slices={slices}'
  else:
    slices = topology.num_slices_from_env()
    if slices > 1:
      source += f' x MEGASCALE_NUM_SLICES={slices}'
  return [topology.Expectation('platform', 'tpu', source),
          topology.Expectation('num_processes', slice_.hosts * slices,
                               source),
          topology.Expectation('local_devices', slice_.devices_per_host,
                               source)]


def _implied_by_pod_launch() -> list[topology.Expectation]:
  """The worker count scripts/launch_tpu_pod.sh read from the pod, if any.

  A worker whose JAX does not find the pod (no libtpu, say) would otherwise
  run a job of its own, "process 0 of 1", beside the others.
  """
  count = os.environ.get(env_vars.EXPECTED_PROCESSES)
  if not count:
    return []
  slices = topology.num_slices_from_env()
  what = (f'{slices} slices x {int(count) // slices} workers' if slices > 1
          else f'{count} workers')
  source = (f'the TPU pod\'s {what} ({env_vars.EXPECTED_PROCESSES}, from '
            'scripts/launch_tpu_pod.sh)')
  expected = [topology.Expectation('num_processes', int(count), source)]
  if slices > 1:
    expected.append(topology.Expectation(
        'num_slices', slices, 'MEGASCALE_NUM_SLICES, from '
        'scripts/launch_tpu_pod.sh --num_slices'))
  return expected


def _join(config: ConfigDict, workdir: str, options: Options, supervised: bool
          ) -> tuple[str, list[topology.Expectation]]:
  """Devices and jax.distributed; returns the mode and what the pod must be."""
  mode = distributed.plan(options.distributed)
  # On a cluster JAX configures itself, the scheduler's variables say what
  # JAX should find; a disagreement is named with the variable.
  place = (cluster.place() if mode == distributed.DETECT else
           cluster.Place(options.distributed.process_id,
                         options.distributed.num_processes, '--process_id',
                         '--local_processes' if supervised else
                         '--num_processes'))
  expected = topology.expectations(
      config.get('topology'),
      implied=_implied_by_accelerator(config) + _implied_by_pod_launch(),
      num_processes=(place.num_processes, place.count_source),
      process_index=(place.process_id, place.id_source),
      local_devices=(options.local_devices, '--local_devices'))
  workload.parse(config.get('workload'))
  distributed.check_jax_untouched()
  devices.configure(options.local_devices,
                    multi_process=mode != distributed.SINGLE)
  if place.process_id is not None and place.num_processes is not None:
    # The rank is known: prefix from here on.
    output_prefix.setup(place.process_id, place.num_processes, supervised,
                      options.log_all_ranks)
  distributed.prepare_environment(options.distributed.coordinator_address)
  roll = None
  if mode != distributed.SINGLE and place.process_id is not None:
    roll = roll_call.RollCall(
        workdir, options.distributed.coordinator_address or '',
        place.process_id, place.num_processes)
  ledger = goodput.current()
  ledger.add('startup', time.time() - ledger.started)
  with ledger.timing('distributed_init'):
    distributed.initialize(mode, options.distributed, roll)
  if mode == distributed.DETECT and place.num_processes is None:
    import jax  # pylint: disable=g-import-not-at-top
    output_prefix.setup(jax.process_index(), jax.process_count(), supervised,
                      options.log_all_ranks)
  return mode, expected


def _job_id() -> str:
  """This job's identity for its lease; restarts of one job share it."""
  if os.environ.get(env_vars.JOB_ID):
    return os.environ[env_vars.JOB_ID]
  if os.environ.get('SLURM_JOB_ID'):
    return f'slurm-{os.environ["SLURM_JOB_ID"]}'
  return uuid.uuid4().hex


def _take_lease(config: ConfigDict, workdir: str, options: Options,
                supervisor: supervisor_lib.Supervisor
                ) -> Optional[lease_lib.Lease]:
  """Process 0 leases the workdir (and checkpoint directory) for the job.

  Raises:
    WorkdirBusyError: on every process, when another job holds a lease.
  """
  job = supervisor.job
  directories = [workdir]
  if config.get('checkpointing', True):
    directories.append(checkpoint.directory(config, workdir))
  taken = []

  def acquire() -> str:
    """Process 0: 'ok', or why the lease was refused."""
    lease = lease_lib.Lease(
        directories, _job_id(), stale_after_s=options.lease_timeout,
        on_lost=lambda m: supervisor.abort(exit_codes.WORKDIR_BUSY, m))
    try:
      lease.acquire()
    except lease_lib.WorkdirBusyError as e:
      return str(e)
    taken.append(lease)
    return 'ok'
  answer = acquire() if job is None else job.from_0(
      'podrun/lease', acquire, options.supervision.barrier_timeout)
  if answer != 'ok':
    raise lease_lib.WorkdirBusyError(answer)
  return taken[0] if taken else None


def _run(config: ConfigDict, workdir: str, options: Options, supervised: bool,
         running: _Running) -> None:
  mode, expected = _join(config, workdir, options, supervised)
  coordination.set_default_timeout(options.supervision.barrier_timeout)
  running.supervisor = supervisor_lib.Supervisor(coordination.current(),
                                                 options.supervision)
  running.supervisor.start()
  actual = topology.current()
  running.supervisor.learn_in(workdir)
  _open_ledger(running.ledger, workdir, running.supervisor.job,
               actual.process_index)
  compilation.use_cache(options.compilation_cache_dir, workdir)
  topology.check(expected, actual)
  if actual.process_index == 0:
    logging.info('topology: %s', actual.describe())
  agreement.agree(coordination.current(), agreement.describe_process(config),
                  'join')
  if mode == distributed.SINGLE:
    # With jax.distributed, SIGTERM is JAX's preemption notice, which the
    # training loop turns into a checkpoint and exit_codes.PREEMPTED.
    signal.signal(signal.SIGTERM, _terminate)
  if options.supervision.enabled:
    running.lease = _take_lease(config, workdir, options, running.supervisor)
  run_workload = workload.resolve(config.workload)
  os.makedirs(workdir, exist_ok=True)
  results = run_workload(config, workdir) or {}
  _finish(config, workdir, actual, results, running.supervisor,
          running.ledger)


def _attempt_name(job: Optional[coordination.Job]) -> str:
  """One name for this attempt on every process: the launcher's, else made
  by process 0 and shared through the coordination service."""
  if os.environ.get(env_vars.ATTEMPT):
    return os.environ[env_vars.ATTEMPT]
  made = time.strftime('%Y%m%d-%H%M%S-', time.gmtime()) + uuid.uuid4().hex[:8]
  if job is None:
    return made
  try:
    return job.from_0('podrun/attempt', lambda: made)
  except coordination.BarrierTimeout:
    return made  # Process 0 is late: the ledgers still get a folder.


def _open_ledger(ledger: goodput.Ledger, workdir: str,
                 job: Optional[coordination.Job], process_index: int) -> None:
  """Starts writing this process's goodput ledger and counting compilation."""
  goodput.open_ledger(ledger, workdir, _attempt_name(job), process_index)
  compilation.count_into(ledger)


def _finish(config: ConfigDict, workdir: str, actual: topology.Topology,
            results: Any,
            supervisor: supervisor_lib.Supervisor,
            ledger: goodput.Ledger) -> None:
  """Waits (bounded) for every process, then process 0 writes summary.json."""
  supervisor.finishing()
  supervisor.publish_final()
  if supervisor.job is not None:
    supervisor.job.barrier('podrun/end_of_run')
  ledger.flush(final=True)
  if actual.process_index == 0:
    ranks = (peers_lib.rank_stats(supervisor.job)
             if supervisor.options.enabled else [])
    summary = _summary(config, actual, results, ranks)
    summary['goodput'] = goodput.summary(goodput.write_rollup(workdir))
    metrics.write_json(os.path.join(workdir, 'summary.json'), summary)
    logging.info('results: %s', metrics.to_json(summary['results']))
    logging.info('wrote %s', os.path.join(workdir, 'summary.json'))
  supervisor.stop()


def run(config: ConfigDict, workdir: str, options: Options) -> int:
  """Runs the job in this process and returns its exit code.

  A failing process publishes its cause to the others (supervisor.py) and
  leaves at once, without JAX's shutdown barrier, which would wait for the
  very processes that are now stuck waiting for this one.

  Args:
    config: the job's ConfigDict.
    workdir: where the job writes.
    options: how this process joins the job.

  Returns:
    An exit code from `exit_codes`, or a workload's own.
  """
  supervised = os.environ.get(env_vars.SUPERVISED) == '1'
  faulthandler.enable()
  # The local pod's hang watchdog asks for every thread's stack this way.
  faulthandler.register(signal.SIGUSR1, all_threads=True)
  if supervised:
    # The pod stops ranks with SIGINT, also those stuck in a collective.
    interrupt.install(_INTERRUPT_GRACE_S, supervisor_lib.flush_and_exit)
  running = _Running()
  goodput.use(running.ledger)
  code = exit_codes.OK
  try:
    _run(config, workdir, options, supervised, running)
  except BaseException as e:  # pylint: disable=broad-except
    code = own_code = exit_codes.code_of(e)
    if code not in (exit_codes.OK, exit_codes.PREEMPTED) and running.supervisor:
      code = running.supervisor.fail(code, _summary_line(e),
                                     exit_codes.may_be_consequence(e))
    _log_failure(e, own_code, consequence=code == exit_codes.PEER_FAILED)
  finally:
    running.ledger.flush(final=True)
    if running.lease is not None:
      running.lease.release()
  if code != exit_codes.OK and coordination.current() is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
  return code


def _summary_line(error: BaseException) -> str:
  """What the other processes are told of this one's failure."""
  if isinstance(error, SystemExit):
    return f'SystemExit({error.code!r})'
  if isinstance(error, KeyboardInterrupt):
    return 'KeyboardInterrupt'
  return peers_lib.first_line(error)


def _log_failure(error: BaseException, code: int, consequence: bool) -> None:
  if consequence:
    logging.error('this process\'s own error, a consequence of that failure:'
                  ' %s', peers_lib.first_line(error))
  elif isinstance(error, SystemExit):
    if code:
      logging.error('exiting with code %d (SystemExit)', code)
  elif isinstance(error, KeyboardInterrupt):
    pass
  elif code == exit_codes.FAILED:
    traceback.print_exception(error)
  elif code == exit_codes.PREEMPTED:
    logging.warning('%s', error)
  else:
    logging.error('%s', error)


def print_plan(argv: list[str], options: distributed.Options,
               local_devices: Optional[int]) -> int:
  """--dry_run without a local pod: what this process would do."""
  try:
    mode = distributed.plan(options)
  except distributed.DistributedInitError as e:
    logging.error('%s', e)
    return exit_codes.DISTRIBUTED_INIT_FAILED
  command = [sys.executable, '-m', 'launcher'] + [
      a for a in argv[1:] if a not in ('--dry_run', '--dry_run=true')]
  print(f'this process would run: {shlex.join(command)}')
  print(f'  jax.distributed: {_MODE_WORDS[mode]}')
  if local_devices is not None:
    print(f'  devices: {local_devices} emulated CPU devices '
          '(jax_platforms=cpu, jax_num_cpu_devices)')
  elif mode == distributed.SINGLE:
    print('  devices: the machine\'s accelerators, else '
          f'{devices.DEFAULT_CPU_DEVICES} emulated CPU devices')
  return exit_codes.OK


_MODE_WORDS = {
    distributed.SINGLE: 'not started (one process, no coordinator)',
    distributed.DETECT: 'initialised from the cluster JAX detects',
    distributed.EXPLICIT: 'initialised from --coordinator_address, '
                          '--num_processes and --process_id',
}
