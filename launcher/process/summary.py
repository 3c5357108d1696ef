"""How a process's run is recorded: its goodput ledger under the attempt's
name, and, once every process is done, WORKDIR/run.json (and summary.json,
where no launcher writes it).

Example:
  >>> open_ledger(ledger, record, coordination.current(), process_index)
  >>> ...                                   # the workload
  >>> finish(config, record, topology.current(), results, supervisor, ledger)
"""

import time
from typing import Any, Optional
import uuid

from absl import logging
from ml_collections import ConfigDict

from launcher.process import compilation
from launcher.process import gpu_host
from runtime.common import version
from launcher.process import peers as peers_lib
from launcher.process import supervisor as supervisor_lib
from runtime.common import handoff
from runtime.common import files
from runtime.common import layout
from runtime.common import records
from launcher.common import goodput_rollup
from runtime.common import goodput
from runtime import coordination
from runtime import topology


def attempt_name(client: Optional[coordination.Client]) -> str:
  """One name for this attempt on every process: the launcher's, else made
  by process 0 and shared through the coordination service."""
  told = handoff.current().attempt
  if told:
    return told
  made = records.attempt_name(
      time.strftime('%Y%m%d-%H%M%S-', time.gmtime()) + uuid.uuid4().hex[:8], 1)
  if client is None:
    return made
  try:
    return client.from_0('podrun/attempt', lambda: made)
  except coordination.BarrierTimeout:
    return made  # Process 0 is late: the ledgers still get a folder.


def open_ledger(ledger: goodput.Ledger, record: layout.Record,
                client: Optional[coordination.Client],
                process_index: int) -> None:
  """Starts writing this process's goodput ledger and counting compilation."""
  goodput.open_ledger(ledger, record, attempt_name(client), process_index)
  compilation.count_into(ledger)


def run_record(config: ConfigDict, topo: topology.Topology, results: Any,
               ranks: list[dict[str, Any]]) -> records.Run:
  """run.json; results are a workload's TrainResult or its own dict."""
  if hasattr(results, 'summary'):
    final_metrics, results = results.final_metrics, results.summary()
  else:
    results = dict(results or {})
    final_metrics = results.pop('final_metrics', None)
  run: records.Run = {
      'podrun_version': version.podrun(),
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
  gpu = gpu_host.current()
  if gpu is not None:
    run['gpu'] = gpu.as_dict()
  return run


def finish(config: ConfigDict,
           record: layout.Record,
           actual: topology.Topology,
           results: Any,
           supervisor: supervisor_lib.Supervisor,
           ledger: goodput.Ledger,
           launcher_record: bool = False) -> None:
  """Waits (bounded) for every process, then process 0 writes run.json;
  and, only where no launcher writes them (`launcher_record`;
  layout.writer), the roll-up (goodput.jsonl) and summary.json."""
  supervisor.finishing()
  supervisor.publish_final()
  if supervisor.client is not None:
    supervisor.client.barrier('podrun/end_of_run')
  ledger.flush(final=True)
  if actual.process_index == 0 and not getattr(results, 'trained', True):
    logging.info('summary.json left as it was: this run trained nothing')
  elif actual.process_index == 0:
    ranks = (peers_lib.rank_stats(supervisor.client)
             if supervisor.options.enabled else [])
    run = run_record(config, actual, results, ranks)
    path = records.write_run(record, run)
    # The launcher, which sees every attempt end, writes them after this.
    if layout.writer(layout.SUMMARY, launcher_record) != layout.LAUNCHER:
      goodput_rollup.roll_up_into_summary(record)
      path = record.summary()
    logging.info('results: %s', files.to_json(run['results']))
    logging.info('wrote %s', path)
  supervisor.stop()
