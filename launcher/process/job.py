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
import signal
import sys
import time
from typing import NoReturn, Optional

from absl import logging
from ml_collections import ConfigDict

from launcher.process import compilation
from launcher.process import devices
from launcher.process import distributed
from launcher.process import gpu_host
from launcher.process import failure
from launcher.process import interrupt
from launcher.process import lease as lease_lib
from launcher.process import obituary
from launcher.process import roll_call
from launcher.process import summary
from launcher.process import supervisor as supervisor_lib
from runtime import agreement
from runtime.checkpoints import options as checkpoint_options
from launcher.common import cluster
from runtime.common import handoff
from runtime.common import exit_codes
from runtime.common import gcs_auth
from runtime.common import goodput
from runtime.common import layout
from runtime.common import version
from launcher.common import output_prefix
from launcher.common import record_mirror
from launcher.common import workload
from runtime import config_reads
from runtime import coordination
from runtime import topology

# How long the main thread has to stop by itself after SIGINT before the
# process exits anyway (launcher/process/interrupt.py): short under the local
# pod, which stops ranks stuck in a collective this way; longer for a
# person's Ctrl-C, which a step or an input read in C does not see at once.
_INTERRUPT_GRACE_S = 0.5
_CTRL_C_GRACE_S = 5.0
_RESUME_HINT = 'the same command resumes from the newest checkpoint'


@dataclasses.dataclass(frozen=True)
class ProcessFlags:
  """How this process joins the job and is supervised.

  Attributes:
    distributed: the coordinator flags.
    local_devices: --local_devices, emulated CPU devices for this process.
    log_all_ranks: show INFO logs of every rank, not only of rank 0.
    supervision: heartbeat, stall and barrier timeouts (supervisor.py),
      and the lease's (lease.py).
    compilation_cache_dir: JAX's persistent compilation cache; None means
      WORKDIR/compilation_cache, '' none.
    config_file: the --config file, for messages ('' where unknown).
    min_processes: processes started by hand (or by a scheduler) that may
      run again on fewer: the fewest (--min_processes, --min_replicas).
      Every count from it to this attempt's is checked before step 1, as a
      launcher's elastic range is (handoff.Handoff.elastic).
    gpu: on a GPU host, the memory fraction and the preset
      (launcher/process/gpu_host.py).
  """
  distributed: distributed.CoordinatorFlags
  local_devices: Optional[int] = None
  log_all_ranks: bool = False
  supervision: supervisor_lib.WatchFlags = supervisor_lib.WatchFlags()
  compilation_cache_dir: Optional[str] = None
  config_file: str = ''
  min_processes: Optional[int] = None
  gpu: gpu_host.GpuPolicy = gpu_host.GpuPolicy()


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


def _join(config: ConfigDict, record: layout.Record, options: ProcessFlags,
          supervised: bool) -> tuple[str, list[topology.Expectation]]:
  """Devices and jax.distributed; returns the mode and what the pod must be."""
  chosen = distributed.plan(options.distributed)
  mode = chosen.mode
  os.environ.update(chosen.environment)
  # On a cluster JAX configures itself, the scheduler's variables say what
  # JAX should find; a disagreement is named with the variable.
  place = (cluster.place() if mode == distributed.DETECT else cluster.Place(
      options.distributed.process_id, options.distributed.num_processes,
      '--process_id', '--local_processes' if supervised else '--num_processes'))
  expected = topology.expectations(
      config.get('topology'),
      implied=(topology.implied_by_accelerator(config.get('topology')) +
               topology.implied_by_pod_launch()),
      num_processes=(place.num_processes, place.count_source),
      process_index=(place.process_index, place.id_source),
      local_devices=(options.local_devices, '--local_devices'))
  workload.parse(config.get('workload'))
  distributed.check_jax_untouched(options.config_file)
  devices.configure(options.local_devices,
                    multi_process=mode != distributed.SINGLE)
  # Before JAX starts its backend: the GPUs, their memory and the preset.
  gpu = (None if options.local_devices is not None else gpu_host.prepare(
      options.gpu))
  gpu_host.remember(gpu)
  if place.process_index is not None and place.num_processes is not None:
    # The rank is known: prefix from here on.
    output_prefix.setup(place.process_index, place.num_processes, supervised,
                        options.log_all_ranks)
  if gpu is not None:
    logging.info('%s', gpu.line)
  if mode == distributed.SINGLE:
    logging.info(
        'podrun %s, one process on all of this host\'s devices, no '
        'coordinator: %s', version.podrun(), chosen.why)
  else:  # After the prefix: every line of a rank carries it.
    logging.info(
        'podrun %s, jax.distributed %s: %s', version.podrun(), 'from the flags'
        if mode == (distributed.EXPLICIT) else 'from the cluster', chosen.why)
  distributed.prepare_environment(options.distributed.coordinator_address)
  roll = None
  if (mode != distributed.SINGLE and place.process_index is not None and
      place.num_processes is not None):
    roll = roll_call.RollCall(record, options.distributed.coordinator_address or
                              '', place.process_index, place.num_processes)
  ledger = goodput.current()
  ledger.add('startup', time.time() - ledger.started)
  with ledger.timing('distributed_init'):
    distributed.initialize(mode, options.distributed, roll,
                           gpu.local_device_ids if gpu else None)
  if mode == distributed.DETECT and place.num_processes is None:
    import jax  # pylint: disable=g-import-not-at-top
    output_prefix.setup(jax.process_index(), jax.process_count(), supervised,
                        options.log_all_ranks)
  return mode, expected


def _take_lease(
    config: ConfigDict, workdir: str, record: layout.Record,
    options: ProcessFlags,
    supervisor: supervisor_lib.Supervisor) -> Optional[lease_lib.Lease]:
  """The workdir (and checkpoint directory) leased for this job."""
  directories = [workdir]
  if config.get('checkpointing', True):
    directories.append(checkpoint_options.directory(config, record))
  return lease_lib.take(directories, supervisor.client,
                        options.supervision.lease_timeout,
                        lambda m: supervisor.abort(exit_codes.WORKDIR_BUSY, m),
                        options.supervision.barrier_timeout)


def _mirror_record(url: str, record_dir: str, process_index: int,
                   launcher_record: bool) -> None:
  """Fetches what earlier attempts left of the record in the bucket to this
  machine's copy, and starts uploading this process's part of it (where no
  launcher writes its files of the record, process 0 uploads them:
  layout.writer)."""
  mirror = record_mirror.Mirror(url,
                                record_dir,
                                record_mirror.process_owns(
                                    process_index, launcher_record),
                                job_id=cluster.job_id())
  try:
    held = mirror.fetch()
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(f'--workdir={url}: cannot read the record in the '
                       f'bucket: {e}') from e
  if process_index == 0:
    logging.info(
        'the record lives in %s (this machine\'s copy: %s; %d '
        'file(s) of earlier attempts)', url, record_dir, held)
  record_mirror.use(mirror)
  mirror.start()


def _uses_bucket(config: ConfigDict, workdir: str) -> bool:
  """Whether the record, the checkpoints or anything else the config names
  (a dataset's directory) is in a bucket."""

  def values(tree):
    for value in tree.values():
      if isinstance(value, (dict, ConfigDict)):
        yield from values(value)
      else:
        yield value

  return any(
      isinstance(v, str) and v.startswith('gs://')
      for v in (workdir, *values(config)))


def _run(config: ConfigDict, workdir: str, options: ProcessFlags,
         told: handoff.Handoff, running: _Running) -> None:
  # A bucket's workdir is written here and mirrored (record_mirror.py); its
  # lease and checkpoints are in the bucket itself.
  record = layout.Record.of(workdir)
  record_dir = record.workdir
  launcher_record = told.launcher_record
  if _uses_bucket(config, workdir):
    # Found while jax.distributed starts, once for every client.
    gcs_auth.start()
  mode, expected = _join(config, record, options, told.supervised)
  ledger = running.ledger
  coordination.set_default_timeout(options.supervision.barrier_timeout)
  running.supervisor = supervisor_lib.Supervisor(coordination.current(),
                                                 options.supervision)
  running.supervisor.start()
  with ledger.naming('backend_start'):
    # The first call that needs the devices starts JAX's backend: about 9 s
    # for a TPU's runtime, in every new process.
    actual = topology.current()
  if record_dir != workdir:
    with ledger.naming('record_fetch'):
      _mirror_record(workdir, record_dir, actual.process_index, launcher_record)
  with ledger.naming('stall_history'):
    running.supervisor.learn_in(record)
  summary.open_ledger(running.ledger, record, running.supervisor.client,
                      actual.process_index)
  # From here a fatal signal's traceback goes through the obituary, which
  # also writes the end this process cannot write itself.
  assert running.ledger.path is not None  # summary.open_ledger named it.
  obituary.start(running.ledger.path, actual.process_index)
  with ledger.naming('compilation_cache'):
    cache = compilation.use_cache(options.compilation_cache_dir, record,
                                  actual.platform, actual.process_count)
  if cache and actual.process_index == 0:
    # JAX writes the cache from process 0 alone: a process that cannot read
    # that directory compiles every program again on every restart.
    logging.info(
        'the compilation cache is %s%s', cache,
        ('; every process must read it (a workdir every host shares, or '
         '--compilation_cache_dir), or the others compile again on every '
         'restart' if actual.process_count > 1 else ''))
  topology.check(expected, actual)
  if actual.process_index == 0:
    logging.info('topology: %s', actual.describe())
  if options.min_processes and not told.elastic:
    _tell_the_range(told, options.min_processes, actual.process_count)
  with ledger.naming('agreement'):
    agreement.agree(coordination.current(),
                    agreement.describe_process(config.to_dict()), 'join')
  if mode == distributed.SINGLE:
    # With jax.distributed, SIGTERM is JAX's preemption notice, which the
    # training loop turns into a checkpoint and exit_codes.PREEMPTED.
    signal.signal(signal.SIGTERM, _terminate)
  if options.supervision.enabled:
    with ledger.naming('lease'):
      running.lease = _take_lease(config, workdir, record, options,
                                  running.supervisor)
  with ledger.naming('workload_import'):
    run_workload = workload.resolve(config.workload)
  # After the workload's import, which may extend sys.path; before its
  # first lowering.
  compilation.same_source_paths(sys.path)
  os.makedirs(record_dir, exist_ok=True)
  if _uses_bucket(config, workdir):
    # The workload's own reads from a bucket (epath, gcsfs) take the
    # credentials found, rather than each searching again.
    with ledger.naming('credentials'):
      gcs_auth.wait()
  # The workload's own set-up, up to runtime.train (training.py names it).
  ledger.mark('workload')
  # runtime.train says, before step 1, what of the config nothing read.
  config_reads.start()
  try:
    # The workload gets the path as a str that carries its record.
    results = run_workload(config, layout.Workdir(record)) or {}
  finally:
    config_reads.stop()
  with ledger.naming('summary'):
    summary.finish(config, record, actual, results, running.supervisor,
                   running.ledger, launcher_record)


def _exit_on_ctrl_c(code: int) -> None:
  """Ends a process that a Ctrl-C did not stop within its grace (blocked
  in a step or an input read)."""
  logging.warning('interrupted (exit %d) while blocked for %g s; %s', code,
                  _CTRL_C_GRACE_S, _RESUME_HINT)
  goodput.current().flush(final=True)
  supervisor_lib.flush_and_exit(code)


def _tell_the_range(told: handoff.Handoff, fewest: int, count: int) -> None:
  """The runtime's elastic range for processes started without a launcher
  of ours: from `fewest` to this attempt's `count`."""
  if not 1 <= fewest <= count:
    raise exit_codes.ConfigError(
        f'--min_processes (or --min_replicas)={fewest} with {count} '
        f'process(es): it must be from 1 to {count}')
  handoff.use(dataclasses.replace(told, elastic=(fewest, count)))


def run(config: ConfigDict, workdir: str, options: ProcessFlags) -> int:
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
  # What the launcher told this process, read once; the runtime takes its
  # part from here (handoff.current()).
  told = handoff.Handoff.read(os.environ)
  handoff.use(told)
  supervised = told.supervised
  faulthandler.enable()
  # The local pod's hang watchdog asks for every thread's stack this way.
  faulthandler.register(signal.SIGUSR1, all_threads=True)
  if supervised:
    # The pod stops ranks with SIGINT, also those stuck in a collective.
    interrupt.install(_INTERRUPT_GRACE_S, supervisor_lib.flush_and_exit)
  else:
    interrupt.install(_CTRL_C_GRACE_S, _exit_on_ctrl_c)
  running = _Running()
  goodput.use(running.ledger)
  code: int = exit_codes.OK
  try:
    _run(config, workdir, options, told, running)
  except BaseException as e:  # pylint: disable=broad-except
    code = own_code = exit_codes.code_of(e)
    if code not in (exit_codes.OK, exit_codes.PREEMPTED) and running.supervisor:
      code = running.supervisor.fail(code, failure.summary_line(e),
                                     exit_codes.may_be_consequence(e))
    failure.log(e, own_code, consequence=code == exit_codes.PEER_FAILED)
    if isinstance(e, KeyboardInterrupt) and not supervised:
      logging.warning('interrupted (exit %d); %s', code, _RESUME_HINT)
  finally:
    running.ledger.flush(final=True)
    record_mirror.finish_current()
    if running.lease is not None:
      running.lease.release()
  if code != exit_codes.OK and coordination.current() is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    if running.supervisor:
      running.supervisor.leave()
    os._exit(code)  # pylint: disable=protected-access
  return code
