"""A batch's records read by worker processes (config.data.workers).

A source whose records take milliseconds of host work each (decoding an
image, augmenting it) starves an accelerator read in one thread. With
`workers` > 0, each batch's ids (podrun's order: runtime/data.py) are cut
into one contiguous run per worker; each worker reads its run (`source[i]`,
or `source.read_batch` where the source has it) and stacks it, and the runs
are joined in order: the same batch, row for row, as a read in the process.
The prefetcher (runtime/prefetch.py) asks for the next batches while steps
run.

The workers are spawned, not forked (a process running JAX's threads must
not fork), and get the source pickled once: a source must pickle (its
functions defined at module level). A record that raises ends the job with
its index and the worker's traceback; a worker that dies ends it with the
records it was reading: neither hangs the loop.

`workers=-1` is auto (`AutoReaders`): the first AUTO_READS reads run in
this process, timed; where a step's records took AUTO_STEP_READ_S or more,
workers take over, as many as bring a step's read to that (`workers_for`),
within this process's share of the host's cores, less one for its own
loop, where the reads kept the CPU busy. A source that does not pickle stays in the process, and the run says
why. The reads that decide are the run's own: no record is read twice.

Example:
  >>> with Readers(source, workers=8) as readers:
  ...   batch = readers.read(np.arange(256))
"""

from concurrent import futures
from concurrent.futures import process as futures_process
import math
import multiprocessing
import os
import pickle
import socket
import threading
import time
from typing import Any, Optional

from absl import logging
import jax
import numpy as np

from runtime.common import exit_codes
from runtime.common import record_reader
from runtime import coordination
from runtime import data as data_lib

AUTO = -1
# Auto times the run's first reads in the process, then decides: a step's
# records read in AUTO_STEP_READ_S or more get workers, enough to bring
# that to AUTO_STEP_READ_S. A worker costs a pickled batch back and a
# process: under it, reading in the process is the faster.
AUTO_READS = 3
AUTO_STEP_READ_S = 0.02
MOST_WORKERS = 16
IO_BOUND_SHARE = 0.5
_HOST_KEY = 'podrun/data_workers_host'


class WorkerError(exit_codes.PodrunError):
  """A data worker raised on a record, or died (exit 1, as the workload's
  own failure)."""
  exit_code = exit_codes.FAILED


class Readers:
  """`workers` spawned processes that read a source's records.

  Raises (from the constructor):
    exit_codes.ConfigError: for a source that does not pickle, naming why.
  """

  def __init__(self, source: Any, workers: int):
    why = unpicklable(source)
    if why:
      raise exit_codes.ConfigError(
          f'config.data.workers={workers}: the data source '
          f'{type(source).__name__} must pickle to reach the worker '
          f'processes, and does not ({why}). Define its '
          'functions at module level (not lambdas or nested functions), '
          'or set config.data.workers=0 to read in this process.')
    self.workers = workers
    self._source = source
    self._pool = futures.ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context('spawn'),
        initializer=record_reader.start,
        initargs=(source,))

  def read(self, ids: np.ndarray) -> Any:
    """The records `ids` in order, read by the workers; each leaf
    (len(ids), ...). No ids: the source's shapes, with no row.

    Raises:
      WorkerError: naming the record that raised (and the worker's
        traceback), or the records of a worker that died.
    """
    ids = np.asarray(ids)
    if not len(ids):
      return data_lib.read_batch(self._source, ids)
    runs = [run for run in np.array_split(ids, self.workers) if len(run)]
    pending = [self._pool.submit(record_reader.read, run) for run in runs]
    parts = []
    for run, part in zip(runs, pending):
      try:
        parts.append(part.result())
      except record_reader.RecordFailed as e:
        raise WorkerError(
            f'record {e.index} of the data source raised in a data worker '
            f'(config.data.workers={self.workers}):\n{e.trace}') from None
      except futures_process.BrokenProcessPool as e:
        raise WorkerError(
            f'a data worker died while reading records {int(run[0])} to '
            f'{int(run[-1])} (config.data.workers={self.workers}): {e}. Its '
            'exit code is in the kernel\'s log (the OOM killer?); '
            'config.data.workers=0 reads in this process.') from None
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *parts)

  def close(self) -> None:
    self._pool.shutdown(wait=True, cancel_futures=True)

  def __enter__(self) -> 'Readers':
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def parse(value: Any) -> int:
  """config.data.workers as a count, or AUTO (-1).

  Raises:
    exit_codes.ConfigError: for anything else.
  """
  if isinstance(value, str) and value in ('auto', str(AUTO)):
    return AUTO
  if isinstance(value, str) and value.isdigit():
    value = int(value)
  if (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and
      value >= AUTO):
    return int(value)
  raise exit_codes.ConfigError(
      f'config.data.workers={value!r}; it must be a number of worker '
      'processes (0: read in this process) or -1 to choose it from the '
      'time the first reads take')


def start(source: Any, workers: int, rows: int,
          client: Optional[coordination.Client]) -> Optional[Any]:
  """The readers config.data.workers asks for: None for 0 (this process
  reads), `AutoReaders` for AUTO (every process calls this, for the host's
  cores), else `Readers`."""
  if workers == AUTO:
    return AutoReaders(source, rows, spare_cores(client))
  return Readers(source, workers) if workers else None


def unpicklable(source: Any) -> str:
  """Why `source` does not pickle ('' where it does)."""
  try:
    pickle.dumps(source)
  except Exception as e:  # pylint: disable=broad-except
    return f'{type(e).__name__}: {e}'
  return ''


def workers_for(record_s: float,
                rows: int,
                spare_cores: int,
                cpu_share: float = 1.0) -> int:
  """Auto's workers: none where a step's `rows` records take under
  AUTO_STEP_READ_S at `record_s` each; else as many as bring that to
  AUTO_STEP_READ_S, at most MOST_WORKERS, and at most `spare_cores` where
  the reads kept the CPU busy (`cpu_share`, CPU over wall time, of
  IO_BOUND_SHARE or more): reads that wait (on storage, a network) are not
  bounded by the cores.

  Example:
    >>> workers_for(0.005, rows=32, spare_cores=6)  # 160 ms a step.
    6
    >>> workers_for(0.005, rows=32, spare_cores=1, cpu_share=0.02)
    8
    >>> workers_for(20e-6, rows=32, spare_cores=6)
    0
  """
  step_s = record_s * rows
  if step_s < AUTO_STEP_READ_S:
    return 0
  room = spare_cores if cpu_share >= IO_BOUND_SHARE else MOST_WORKERS
  return max(0, min(room, MOST_WORKERS, math.ceil(step_s / AUTO_STEP_READ_S)))


def spare_cores(client: Optional[coordination.Client]) -> int:
  """This process's share of its host's cores, less one for its own loop:
  the processes of the job on this host are counted by host name (every
  process calls this, or none)."""
  cores = len(os.sched_getaffinity(0))
  here = 1
  if client is not None and client.process_count > 1:
    host = socket.gethostname()
    client.publish(_HOST_KEY, host)
    here = sum(1 for name in client.gather(_HOST_KEY).values() if name == host)
  return max(0, cores // here - 1)


class AutoReaders:
  """config.data.workers=-1: the first AUTO_READS reads in this process,
  timed; then `Readers` where `workers_for` gives any (process 0 says what
  it chose, and why).

  Args:
    source: the data source.
    rows: this process's records a step.
    spare_cores: `spare_cores()`.
  """

  def __init__(self, source: Any, rows: int, spare_cores: int):
    self._source, self._rows, self._cores = source, rows, spare_cores
    self._record_s: list[float] = []
    self._cpu_s = self._wall_s = 0.0
    self._readers: Optional[Readers] = None
    self._lock = threading.Lock()  # The pool's start against close().
    self._closed = False
    self.workers: Optional[int] = None  # Until it decides.

  def read(self, ids: np.ndarray) -> Any:
    """The records `ids` in order, each leaf (len(ids), ...); called from
    one thread (the prefetcher's)."""
    if self._readers is not None:
      return self._readers.read(ids)
    started, cpu_started = time.perf_counter(), time.thread_time()
    batch = data_lib.read_batch(self._source, ids)
    if self.workers is None and len(ids):
      wall_s = time.perf_counter() - started
      self._wall_s += wall_s
      self._cpu_s += time.thread_time() - cpu_started
      self._record_s.append(wall_s / len(ids))
      if len(self._record_s) == AUTO_READS:
        with self._lock:
          if not self._closed:
            self._decide()
    return batch

  def _decide(self) -> None:
    record_s = float(np.median(self._record_s))
    cpu_share = self._cpu_s / self._wall_s if self._wall_s else 1.0
    wanted = workers_for(record_s, self._rows, self._cores, cpu_share)
    why = unpicklable(self._source) if wanted else ''
    self.workers = 0 if why else wanted
    if self.workers:
      self._readers = Readers(self._source, self.workers)
    if jax.process_index() == 0:
      logging.info(
          'config.data.workers=auto: %d worker(s): a step\'s %d records '
          'took %.1f ms to read here, %.0f%% of it on the CPU, with %d '
          'spare core(s)%s', self.workers, self._rows,
          1000 * record_s * self._rows, 100 * cpu_share, self._cores,
          f'; but the source does not pickle ({why})' if why else '')

  def close(self) -> None:
    with self._lock:
      self._closed = True
      if self._readers is not None:
        self._readers.close()

  def __enter__(self) -> 'AutoReaders':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
