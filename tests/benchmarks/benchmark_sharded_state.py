"""Sharded state against replicated: the state's bytes per device and the
step time, for the character-level transformer of the tests with Adam.

  python tests/benchmarks/benchmark_sharded_state.py [--width=256]
      [--steps=40] [--rounds=2]

Each round runs, on local pods of 1x8 and 2x4, the same job with
config.state_layout 'replicated' and 'sharded' (config.parallelism
'shard_map' both, replica 'process'), side by side. Bytes per device come
from the sharded run's console line (state_layout.Footprint: split, whole,
and the whole state as the replicated layout holds it); the step time is
the median of metrics.jsonl's steps_per_sec after the first logged window
(compilation). Prints a table and one JSON object.
"""

import argparse
import json
import pathlib
import re
import statistics
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests import helpers  # pylint: disable=g-import-not-at-top,wrong-import-position

_SAID = re.compile(r'state sharded: .*?; state per device (.*?): (.*?) of it '
                   r'split (\d+) ways, (.*?) whole.*?; (.*?) whole on every '
                   r'device')
TOPOLOGIES = {'1x8': (1, 8), '2x4': (2, 4)}


def _run(workdir: pathlib.Path, layout: str, processes: int, devices: int,
         width: int, steps: int) -> dict:
  result = helpers.run_launcher([
      '--config=tests/workloads/charlm_config.py',
      f'--config.model.width={width}', '--config.model.heads=4',
      '--config.optimizer.name=adam', '--config.optimizer.learning_rate=1e-3',
      f'--config.steps={steps}', '--config.log_every=5',
      '--config.global_batch_size=48', '--config.parallelism=shard_map',
      f'--config.state_layout={layout}', f'--local_processes={processes}',
      f'--local_devices={devices}', f'--workdir={workdir}'
  ],
                                timeout=600)
  if result.returncode != 0:
    raise RuntimeError(result.output[-3000:])
  rates = [
      r['steps_per_sec']
      for r in helpers.read_jsonl(workdir / 'metrics.jsonl')
      if 'steps_per_sec' in r
  ][1:]
  out = {'step_s': 1.0 / statistics.median(rates)}
  said = _SAID.search(result.output)
  if said:
    out.update(per_device=said.group(1),
               split=said.group(2),
               shards=int(said.group(3)),
               whole=said.group(4),
               replicated=said.group(5))
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--width', type=int, default=256)
  parser.add_argument('--steps', type=int, default=40)
  parser.add_argument('--rounds', type=int, default=2)
  args = parser.parse_args(argv)
  rows = {}
  with tempfile.TemporaryDirectory(prefix='sharded-bench-') as root:
    for round_ in range(args.rounds):
      for name, (processes, devices) in TOPOLOGIES.items():
        for layout in ('replicated', 'sharded'):
          workdir = pathlib.Path(root) / f'{round_}-{name}-{layout}'
          rows.setdefault((name, layout), []).append(
              _run(workdir, layout, processes, devices, args.width, args.steps))
  print('| pod | state per device, sharded (split + whole) | replicated | '
        'step, sharded / replicated |')
  print('| --- | --- | --- | --- |')
  summary = {}
  for name in TOPOLOGIES:
    sharded, replicated = rows[(name, 'sharded')], rows[(name, 'replicated')]
    ratio = statistics.median(
        s['step_s'] / r['step_s'] for s, r in zip(sharded, replicated))
    last = sharded[-1]
    print(f'| {name} | {last["per_device"]} ({last["split"]} split '
          f'{last["shards"]} ways + {last["whole"]} whole) | '
          f'{last["replicated"]} | {ratio:.2f} |')
    summary[name] = {
        'sharded': sharded,
        'replicated': replicated,
        'step_ratio': ratio
    }
  print(
      json.dumps({
          'width': args.width,
          'steps': args.steps,
          'rounds': args.rounds,
          'topologies': summary
      }))
  return 0


if __name__ == '__main__':
  sys.exit(main())
