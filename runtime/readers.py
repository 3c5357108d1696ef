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

Example:
  >>> with Readers(source, workers=8) as readers:
  ...   batch = readers.read(np.arange(256))
"""

from concurrent import futures
from concurrent.futures import process as futures_process
import multiprocessing
import pickle
from typing import Any

import jax
import numpy as np

from runtime.common import exit_codes
from runtime.common import record_reader
from runtime import data as data_lib


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
    try:
      pickle.dumps(source)
    except Exception as e:  # pylint: disable=broad-except
      raise exit_codes.ConfigError(
          f'config.data.workers={workers}: the data source '
          f'{type(source).__name__} must pickle to reach the worker '
          f'processes, and does not ({type(e).__name__}: {e}). Define its '
          'functions at module level (not lambdas or nested functions), '
          'or set config.data.workers=0 to read in this process.') from e
    self.workers = workers
    self._source = source
    self._pool = futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context('spawn'),
        initializer=record_reader.start, initargs=(source,))

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
