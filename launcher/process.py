"""Running the job in this process: devices, jax.distributed, the topology
check, then the workload.

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
import traceback
from typing import Any, Optional

from absl import logging

from launcher import cluster
from launcher import devices
from launcher import distributed
from launcher import exit_codes
from launcher import rank_output
from launcher import tpu_accelerators
from launcher import workload
from runtime import checkpoint
from runtime import idx
from runtime import metrics
from runtime import parallel
from runtime import preemption
from runtime import sharding
from runtime import topology

_KNOWN_ERRORS = (
    (workload.ConfigError, exit_codes.CONFIG_ERROR),
    (cluster.ClusterEnvError, exit_codes.CONFIG_ERROR),
    (sharding.BatchSizeError, exit_codes.CONFIG_ERROR),
    (parallel.DeviceAxisError, exit_codes.CONFIG_ERROR),
    (topology.TopologyMismatchError, exit_codes.TOPOLOGY_MISMATCH),
    (distributed.DistributedInitError, exit_codes.DISTRIBUTED_INIT_FAILED),
    (checkpoint.CheckpointError, exit_codes.CHECKPOINT_ERROR),
    (idx.IdxError, exit_codes.CONFIG_ERROR),
    (preemption.Preempted, exit_codes.PREEMPTED),
)


@dataclasses.dataclass(frozen=True)
class Options:
  """How this process joins the job.

  Attributes:
    distributed: the coordinator flags.
    local_devices: --local_devices, emulated CPU devices for this process.
    log_all_ranks: show INFO logs of every rank, not only of rank 0.
  """
  distributed: distributed.Options
  local_devices: Optional[int] = None
  log_all_ranks: bool = False


def _terminate(signum, frame):
  del frame
  # Unwind the stack so `finally` blocks run; the launcher kills what stays.
  raise SystemExit(exit_codes.SIGNAL_BASE + signum)


def _summary(config, topo: topology.Topology, results: dict[str, Any]
             ) -> dict[str, Any]:
  results = dict(results)
  final_metrics = results.pop('final_metrics', None)
  results.pop('params', None)
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
      'results': results,
  }


def _implied_by_accelerator(config) -> list[topology.Expectation]:
  """What config.topology.accelerator_type says of the pod, if it is set."""
  name = (config.get('topology') or {}).get('accelerator_type')
  if not name:
    return []
  try:
    slice_ = tpu_accelerators.slice_topology(name)
  except tpu_accelerators.AcceleratorTypeError as e:
    raise workload.ConfigError(f'config.topology.accelerator_type: {e}')
  source = f'config.topology.accelerator_type={name}'
  return [topology.Expectation('platform', 'tpu', source),
          topology.Expectation('num_processes', slice_.hosts, source),
          topology.Expectation('local_devices', slice_.devices_per_host,
                               source)]


def _run(config, workdir: str, options: Options, supervised: bool) -> None:
  mode = distributed.plan(options.distributed)
  # On a cluster JAX configures itself, the scheduler's variables say what
  # JAX should find; a disagreement is named with the variable.
  place = (cluster.place() if mode == distributed.DETECT else
           cluster.Place(options.distributed.process_id,
                         options.distributed.num_processes, '--process_id',
                         '--local_processes' if supervised else
                         '--num_processes'))
  expected = topology.expectations(
      config.get('topology'), implied=_implied_by_accelerator(config),
      num_processes=(place.num_processes, place.count_source),
      process_index=(place.process_id, place.id_source),
      local_devices=(options.local_devices, '--local_devices'))
  workload.parse(config.get('workload'))
  distributed.check_jax_untouched()
  devices.configure(options.local_devices,
                    multi_process=mode != distributed.SINGLE)
  if place.process_id is not None and place.num_processes is not None:
    # The rank is known: prefix from here on.
    rank_output.setup(place.process_id, place.num_processes, supervised,
                      options.log_all_ranks)
  distributed.prepare_environment(options.distributed.coordinator_address)
  distributed.initialize(mode, options.distributed)

  actual = topology.current()
  if mode == distributed.DETECT and place.num_processes is None:
    rank_output.setup(actual.process_index, actual.process_count, supervised,
                      options.log_all_ranks)
  topology.check(expected, actual)
  if actual.process_index == 0:
    logging.info('topology: %s', actual.describe())
  if mode == distributed.SINGLE:
    # With jax.distributed, SIGTERM is JAX's preemption notice, which the
    # training loop turns into a checkpoint and exit_codes.PREEMPTED.
    signal.signal(signal.SIGTERM, _terminate)

  run_workload = workload.resolve(config.workload)
  os.makedirs(workdir, exist_ok=True)
  results = run_workload(config, workdir) or {}
  if actual.process_index == 0:
    summary = _summary(config, actual, results)
    metrics.write_json(os.path.join(workdir, 'summary.json'), summary)
    logging.info('results: %s', metrics.to_json(summary['results']))
    logging.info('wrote %s', os.path.join(workdir, 'summary.json'))


def run(config, workdir: str, options: Options) -> int:
  """Runs the job in this process and returns its exit code.

  A failing process of a multi-process job leaves at once, without JAX's
  shutdown barrier, which would wait for the very processes that are now
  stuck waiting for this one.

  Args:
    config: the job's ConfigDict.
    workdir: where the job writes.
    options: how this process joins the job.

  Returns:
    An exit code from `exit_codes`, or a workload's own.
  """
  supervised = os.environ.get(rank_output.SUPERVISED_ENV) == '1'
  faulthandler.enable()
  # The local pod's hang watchdog asks for every thread's stack this way.
  faulthandler.register(signal.SIGUSR1, all_threads=True)
  code = exit_codes.OK
  try:
    _run(config, workdir, options, supervised)
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if code:
      logging.error('exiting with code %d (SystemExit)', code)
  except KeyboardInterrupt:
    code = exit_codes.SIGNAL_BASE + signal.SIGINT
  except Exception as e:  # pylint: disable=broad-except
    code = next((c for t, c in _KNOWN_ERRORS if isinstance(e, t)), None)
    if code is None:
      traceback.print_exc()
      code = exit_codes.FAILED
    elif code == exit_codes.PREEMPTED:
      logging.warning('%s', e)
    else:
      logging.error('%s', e)
  if code != exit_codes.OK:
    from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
    if jax_distributed.global_state.client is not None:
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(code)  # pylint: disable=protected-access
  return code


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
