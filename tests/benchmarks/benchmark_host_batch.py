"""The host's part of a call's batch: what the prefetch thread does for one
call of k steps, the way it did before issue 71's one read and the way it
does now, side by side in one process, rounds alternating.

  python tests/benchmarks/benchmark_host_batch.py [--devices=1]
      [--parallelism=pmap] [--steps_per_call=1,25] [--calls=60] [--rounds=3]

The data are the MNIST MLP's of benchmark_chip.py (16,384 synthetic digits
of 784 float32 features, batch 256). Two ways, each to the batch placed on
the devices (`block_until_ready`):

- stacked: each step's ids, each step's read (a fancy index per array),
  then `dispatch.stack` of the steps: two host copies of the call's batch;
- one_read: the loader of runtime/loader.py: the call's ids at once, put
  in the order `stack` gives, and one read: one copy;
- on_device: that loader with config.data.on_device: the ids placed, and
  the batch gathered from the data set on the devices (placed once,
  before the clock). On a CPU the gather is a host copy too; on an
  accelerator it runs on the chip.

Prints milliseconds a call (median over the rounds of each round's mean
after the first 5 calls) and each against stacked; --out writes the JSON.
"""

import argparse
import json
import pathlib
import statistics
import sys
import time
import types

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def _stacked(task, options, topo, par, layout):
  """The loader as it was: a read and a copy per step, then the stack."""
  from runtime import data as data_lib  # pylint: disable=g-import-not-at-top
  from runtime import dispatch  # pylint: disable=g-import-not-at-top
  from runtime.parallelism import microbatches  # pylint: disable=g-import-not-at-top
  rows, real = microbatches.process_positions(layout, topo.process_index,
                                              topo.local_device_count)

  def read(step):
    ids = data_lib.global_batch_ids(step, options.global_batch_size,
                                    len(task.data), options.seed,
                                    options.shuffle)
    return data_lib.read_padded(task.data, ids[rows.start:rows.start + real],
                                rows.stop - rows.start)

  def load(step, steps):
    return par.put_batch(
        dispatch.stack([read(s) for s in range(step, step + steps)],
                       topo.local_device_count))

  return load


def _ms_a_call(load, k: int, calls: int) -> float:
  import jax  # pylint: disable=g-import-not-at-top
  spent = []
  for call in range(calls):
    started = time.perf_counter()
    jax.block_until_ready(load(call * k, k))
    spent.append(time.perf_counter() - started)
  return 1000 * statistics.mean(spent[5:])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--devices', type=int, default=1)
  parser.add_argument('--parallelism', default='pmap')
  parser.add_argument('--steps_per_call', default='1,25')
  parser.add_argument('--calls', type=int, default=60)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--out', default=None)
  args = parser.parse_args()
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_num_cpu_devices', args.devices)
  from runtime import parallelism  # pylint: disable=g-import-not-at-top
  from runtime import loader  # pylint: disable=g-import-not-at-top
  from runtime.parallelism import microbatches  # pylint: disable=g-import-not-at-top
  from tests.benchmarks import benchmark_chip  # pylint: disable=g-import-not-at-top
  config = benchmark_chip._mnist_config(1)  # pylint: disable=protected-access
  task = benchmark_chip._mnist_task(config)  # pylint: disable=protected-access
  options = types.SimpleNamespace(global_batch_size=config.global_batch_size,
                                  seed=0,
                                  shuffle=True,
                                  on_device=False)
  topo = types.SimpleNamespace(process_index=0,
                               local_device_count=jax.local_device_count())
  par = parallelism.named(args.parallelism)
  layout = microbatches.plan(config.global_batch_size, jax.device_count())
  kept = types.SimpleNamespace(**{**vars(options), 'on_device': True})
  ways = {
      'stacked': _stacked(task, options, topo, par, layout),
      'one_read': loader.make(options, task, topo, par, layout),
      'on_device': loader.make(kept, task, topo, par, layout)
  }
  out = {
      'device_kind': jax.devices()[0].device_kind,
      'devices': jax.device_count(),
      'parallelism': args.parallelism,
      'jax': jax.__version__,
      'date': time.strftime('%Y-%m-%d')
  }
  for k in (int(n) for n in args.steps_per_call.split(',')):
    rounds = {name: [] for name in ways}
    for r in range(args.rounds):
      names = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]
      for name in names:
        rounds[name].append(_ms_a_call(ways[name], k, args.calls))
    median = {name: statistics.median(v) for name, v in rounds.items()}
    out[f'k{k}'] = {
        'ms_a_call': median,
        'rounds': rounds,
        'one_read_vs_stacked': median['one_read'] / median['stacked'],
        'on_device_vs_stacked': median['on_device'] / median['stacked']
    }
    print(f'k = {k}: ' +
          ', '.join(f'{name} {ms:.2f} ms a call ({ms / median["stacked"]:.2f}x)'
                    for name, ms in median.items()))
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == '__main__':
  main()
