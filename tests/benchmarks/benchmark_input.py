"""Heavy records: the input wait read in the process against worker processes
(config.data.workers), and against auto's choice (-1), side by side in one
run.

  python tests/benchmarks/benchmark_input.py [--record_ms=5] [--workers=16]
      [--steps=60] [--batch=64] [--step_ms=40] [--out=input.json]

The source's records each take --record_ms of host work that leaves the
CPU free (a wait, as reading from remote storage or a decoder in C does);
the model is the linear regression of configs/linear_regression.py on 8
emulated CPU devices, each step paced to --step_ms (a hook that waits, as
the host waits for an accelerator's step). Prints each way's input wait
fraction (the median of its step lines after the first, whose window holds
the workers' start), auto's line saying what it chose, and whether every
way trained the same parameters.
"""

import argparse
import json
import logging
import os
import pathlib
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')


class SlowRecords:
  """linear_regression's records, each `record_s` of waiting to read."""

  def __init__(self, arrays: dict, record_s: float):
    self.arrays, self.record_s = arrays, record_s

  def __len__(self):
    return len(self.arrays['x'])

  def __getitem__(self, index: int):
    time.sleep(self.record_s)
    return {name: a[index] for name, a in self.arrays.items()}


class _Pace:
  """A hook: every step waits `seconds`, as for a device's compute."""

  def __init__(self, seconds: float):
    self.seconds = seconds

  def begin(self, run):
    pass

  def after_step(self, run):
    time.sleep(self.seconds)

  def end(self, run, error):
    pass


class _Said(logging.Handler):
  """Keeps the log lines that name config.data.workers."""

  def __init__(self):
    super().__init__()
    self.lines = []

  def emit(self, record):
    if 'config.data.workers' in record.getMessage():
      self.lines.append(record.getMessage())


def _run(workers: int, args, scratch: str) -> dict:
  import dataclasses  # pylint: disable=g-import-not-at-top
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  from configs import linear_regression as config_lib  # pylint: disable=g-import-not-at-top
  from runtime import training  # pylint: disable=g-import-not-at-top
  from runtime.workloads import linear_regression  # pylint: disable=g-import-not-at-top
  config = config_lib.get_config()
  config.steps, config.log_every = args.steps, 10
  config.global_batch_size = args.batch
  config.checkpointing = False
  config.data.workers = workers
  task, _ = linear_regression.make_task(config)
  task = dataclasses.replace(task,
                             data=SlowRecords(task.data.arrays,
                                              args.record_ms / 1000),
                             hooks=(_Pace(args.step_ms / 1000),))
  workdir = os.path.join(scratch, f'workers_{workers}')
  said = _Said()
  absl_logging.set_verbosity(absl_logging.INFO)
  absl_logging.get_absl_logger().addHandler(said)
  started = time.perf_counter()
  try:
    result = training.train(config, workdir, task)
  finally:
    absl_logging.get_absl_logger().removeHandler(said)
  seconds = time.perf_counter() - started
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  waits = [
      r['input_wait_fraction'] for r in rows[1:] if 'input_wait_fraction' in r
  ]
  return {
      'seconds': seconds,
      'input_wait_fraction': statistics.median(waits),
      'fingerprint': result.fingerprint['sha256'],
      'said': said.lines
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--record_ms', type=float, default=5.0)
  parser.add_argument('--workers', type=int, default=16)
  parser.add_argument('--steps', type=int, default=60)
  parser.add_argument('--step_ms', type=float, default=40.0)
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--out', default=None)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory(prefix='podrun_input_') as scratch:
    out = {
        'in_process': _run(0, args, scratch),
        'with_workers': _run(args.workers, args, scratch),
        'auto': _run(-1, args, scratch)
    }
  out.update(record_ms=args.record_ms,
             workers=args.workers,
             batch=args.batch,
             steps=args.steps,
             same_parameters=len({
                 out[way]['fingerprint']
                 for way in ('in_process', 'with_workers', 'auto')
             }) == 1)
  print(f'records of {args.record_ms:g} ms, batch {args.batch}: input wait '
        f'{out["in_process"]["input_wait_fraction"]:.3f} read in the process,'
        f' {out["with_workers"]["input_wait_fraction"]:.3f} with '
        f'{args.workers} workers, {out["auto"]["input_wait_fraction"]:.3f} '
        f'auto ({"; ".join(out["auto"]["said"]) or "it said nothing"}); '
        f'the same parameters: {out["same_parameters"]}')
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == '__main__':
  main()
