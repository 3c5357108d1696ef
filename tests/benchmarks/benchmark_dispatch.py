"""Steps per call against speed: `runtime.train` on a small step with
config.steps_per_dispatch = 1, 4, 16 and 64, side by side in one process,
rounds alternating.

  python tests/benchmarks/benchmark_dispatch.py [--workload=linear_regression]
      [--devices=1] [--steps=2000] [--rounds=3] [--out=dispatch.json]

Workloads: linear_regression (configs/linear_regression.py: 3 features,
batch 256, SGD) and mnist_mlp (the MLP of benchmark_chip.py, synthetic
digits). Each run's speed counts the steps after the first 64 (the
compilations) to the end of the last step; a figure is the median over the
rounds, and each k's is also given against k = 1. Checkpoints are off and
log_every is 64, so that every k divides it.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

PER_CALL = (1, 4, 16, 64)


def _task(workload: str, steps: int):
  from tests.benchmarks import benchmark_chip  # pylint: disable=g-import-not-at-top
  if workload == 'mnist_mlp':
    config = benchmark_chip._mnist_config(steps)  # pylint: disable=protected-access
    return config, benchmark_chip._mnist_task(config)  # pylint: disable=protected-access
  from configs import linear_regression  # pylint: disable=g-import-not-at-top
  from runtime.workloads import linear_regression as workload_lib  # pylint: disable=g-import-not-at-top
  config = linear_regression.get_config()
  config.steps = steps
  task, _ = workload_lib.make_task(config)
  return config, task


def _rate(config, task, k: int, workdir: str) -> float:
  from runtime import training  # pylint: disable=g-import-not-at-top
  from tests.benchmarks import benchmark_chip  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  config.steps_per_dispatch, config.checkpointing = k, False
  config.log_every, config.integrity_every = 64, 0
  clock = benchmark_chip._clock(warm=64)  # pylint: disable=protected-access
  training.train(config, workdir, dataclasses.replace(task, hooks=(clock,)))
  return clock.rate


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--workload',
                      default='linear_regression',
                      choices=('linear_regression', 'mnist_mlp'))
  parser.add_argument('--devices', type=int, default=1)
  parser.add_argument('--steps', type=int, default=2048)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--out', default=None)
  args = parser.parse_args()
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_num_cpu_devices', args.devices)
  config, task = _task(args.workload, args.steps)
  rates = {k: [] for k in PER_CALL}
  with tempfile.TemporaryDirectory(prefix='podrun_dispatch_') as scratch:
    for r in range(args.rounds):
      order = PER_CALL[r % len(PER_CALL):] + PER_CALL[:r % len(PER_CALL)]
      for k in order:
        rates[k].append(
            _rate(config, task, k, os.path.join(scratch, f'k{k}_{r}')))
  median = {k: statistics.median(v) for k, v in rates.items()}
  device = jax.devices()[0]
  out = {
      'workload': args.workload,
      'device_kind': device.device_kind,
      'devices': jax.device_count(),
      'jax': jax.__version__,
      'steps': args.steps,
      'steps_per_sec': median,
      'rounds': rates,
      'vs_k1': {
          k: median[k] / median[1] for k in PER_CALL
      }
  }
  print(f'{args.workload} on {jax.device_count()} {device.device_kind} '
        f'device(s), JAX {jax.__version__}')
  print('| steps per call | steps/s | against k = 1 |')
  for k in PER_CALL:
    print(f'| {k} | {median[k]:.0f} | {out["vs_k1"][k]:.2f} |')
  text = json.dumps(out, indent=1)
  if args.out:
    pathlib.Path(args.out).write_text(text)


if __name__ == '__main__':
  main()
