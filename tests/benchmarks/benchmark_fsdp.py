"""Sharded state against replicated: the bytes per device the compiled step
needs, and the step time, for the decoder LM of configs/decoder.py with
each layer recomputed in the backward pass (config.model.remat), Adam, on
8 CPU devices.

  python tests/benchmarks/benchmark_fsdp.py [--budget_mib=512]
      [--widths=256,512,768,1024,1536] [--layers=4] [--time_width=512]
      [--steps=12] [--out=fsdp.json]

For each width: XLA's memory analysis of the compiled step
(runtime/memory.py), from abstract arguments (nothing is allocated),
replicated and sharded over one replica of 8 devices ('1x8') and over two
replicas of 4 ('2x4', as two processes of 4 devices with replica
'process' split it), and the largest width each fits within the budget.
Then, at --time_width, the step time of each, rounds alternating, in this
one process. Prints a table and one JSON object.
"""

import argparse
import json
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

GRIDS = {'1x8': 1, '2x4': 2}  # name: replicas.


def _task(width: int, layers: int):
  from configs import decoder as decoder_config  # pylint: disable=g-import-not-at-top
  from runtime.workloads import decoder  # pylint: disable=g-import-not-at-top
  config = decoder_config.get_config('tiny')
  config.model.width, config.model.layers, config.model.heads = (width, layers,
                                                                 8)
  config.model.sequence_length, config.model.vocab_size = 128, 2048
  config.model.remat = True
  return config, decoder.make_task(config)


def _steps(task, replicas: int):
  """{'replicated': (step, state shardings), 'sharded': ...} on 8 devices,
  the sharded one over `replicas` replicas."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from runtime import parallelism  # pylint: disable=g-import-not-at-top
  from runtime import step as step_lib  # pylint: disable=g-import-not-at-top
  from runtime.parallelism import state_layout  # pylint: disable=g-import-not-at-top
  host = step_lib.init_state(task.params, task.optimizer, seed=0)
  whole = NamedSharding(parallelism.global_mesh(), PartitionSpec())
  grid = Mesh(
      np.array(parallelism.global_mesh().devices.flat).reshape(replicas, -1),
      (state_layout.REPLICA_AXIS, state_layout.SHARD_AXIS))
  placed = step_lib.state_shardings(
      grid, state_layout.specs(host, grid.shape[state_layout.SHARD_AXIS]))
  return host, {
      'replicated': (step_lib.make_train_step(task.loss_fn, task.optimizer,
                                              parallelism.SHARD_MAP),
                     jax.tree_util.tree_map(lambda _: whole, host)),
      'sharded': (step_lib.make_sharded_train_step(task.loss_fn, task.optimizer,
                                                   placed), placed)
  }


def step_memory(width: int, layers: int, replicas: int) -> dict:
  """{'replicated': StepMemory, 'sharded': StepMemory} of one step."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from runtime import memory  # pylint: disable=g-import-not-at-top
  from runtime import parallelism  # pylint: disable=g-import-not-at-top
  config, task = _task(width, layers)
  host, steps = _steps(task, replicas)
  batch = parallelism.SHARD_MAP.put_batch(
      task.data.read_batch(range(config.global_batch_size)))
  abstract = lambda tree, shardings: jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(
          np.shape(x), np.result_type(x), sharding=s), tree, shardings)
  return {
      name:
          memory.of_compiled(
              step.lower(abstract(host, shardings), batch).compile())
      for name, (step, shardings) in steps.items()
  }


def step_seconds(width: int, layers: int, replicas: int, steps: int,
                 rounds: int) -> dict:
  """Median seconds per step (after the first) of each layout."""
  import jax  # pylint: disable=g-import-not-at-top
  from runtime import parallelism  # pylint: disable=g-import-not-at-top
  config, task = _task(width, layers)
  host, made = _steps(task, replicas)
  batches = [
      parallelism.SHARD_MAP.put_batch(
          task.data.read_batch(
              range(i * config.global_batch_size,
                    (i + 1) * config.global_batch_size))) for i in range(steps)
  ]
  seconds = {name: [] for name in made}
  for r in range(rounds):
    for name in list(made)[r % 2:] + list(made)[:r % 2]:
      step, shardings = made[name]
      state = jax.device_put(host, shardings)
      state, metrics = step(state, batches[0])
      jax.block_until_ready(metrics)
      started = time.perf_counter()
      for batch in batches[1:]:
        state, metrics = step(state, batch)
      jax.block_until_ready((state, metrics))
      seconds[name].append((time.perf_counter() - started) / (steps - 1))
  return {name: statistics.median(v) for name, v in seconds.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--budget_mib', type=float, default=512)
  parser.add_argument('--widths', default='256,512,768,1024,1536')
  parser.add_argument('--layers', type=int, default=4)
  parser.add_argument('--time_width', type=int, default=512)
  parser.add_argument('--steps', type=int, default=12)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--out', default=None)
  args = parser.parse_args()
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_num_cpu_devices', 8)
  budget = args.budget_mib * 2**20
  out = {
      'jax': jax.__version__,
      'layers': args.layers,
      'budget_mib': args.budget_mib,
      'widths': {},
      'largest': {},
      'date': time.strftime('%Y-%m-%d')
  }
  print(
      '| width | grid | replicated MiB | sharded MiB | sharded / replicated |')
  for width in (int(w) for w in args.widths.split(',')):
    for grid, replicas in GRIDS.items():
      need = step_memory(width, args.layers, replicas)
      row = {name: m.as_dict() for name, m in need.items()}
      row['ratio'] = need['sharded'].total / need['replicated'].total
      out['widths'].setdefault(str(width), {})[grid] = row
      for name, m in need.items():
        if m.total <= budget:
          key = f'{grid} {name}'
          out['largest'][key] = max(out['largest'].get(key, 0), width)
      print(
          f'| {width} | {grid} | {need["replicated"].total / 2**20:.0f} | '
          f'{need["sharded"].total / 2**20:.0f} | {row["ratio"]:.3f} |',
          flush=True)
  print(f'largest width within {args.budget_mib:g} MiB a device: '
        f'{out["largest"]}')
  out['step_s'] = {}
  for grid, replicas in GRIDS.items():
    seconds = step_seconds(args.time_width, args.layers, replicas, args.steps,
                           args.rounds)
    seconds[
        'sharded_vs_replicated'] = seconds['sharded'] / seconds['replicated']
    out['step_s'][grid] = seconds
    print(
        f'step time at width {args.time_width}, {grid}: replicated '
        f'{seconds["replicated"] * 1000:.0f} ms, sharded '
        f'{seconds["sharded"] * 1000:.0f} ms '
        f'({seconds["sharded_vs_replicated"]:.2f}x)',
        flush=True)
  text = json.dumps(out, indent=1)
  if args.out:
    pathlib.Path(args.out).write_text(text)


if __name__ == '__main__':
  main()
