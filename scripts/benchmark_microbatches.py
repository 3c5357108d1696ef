"""Steps per second of one global batch as 1, 2 or 4 microbatches, and of a
batch that does not divide over the devices.

Each case is one `python -m launcher` process with emulated CPU devices,
side by side in one run, the rounds alternated; the figure is the median
of the logged windows after the first (compilation):

- configs/mlp.py and configs/mnist_cnn.py (synthetic digits), 256 examples
  on 8 devices, as 1 pass, 2 and 4 microbatches a device;
- configs/mlp.py, 256 examples on 24 devices (16 groups of 16, 8 devices
  of padding) and on 32 (one group of 8 each).

  python scripts/benchmark_microbatches.py [--rounds=2] [--out=FILE.json]
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts import side_by_side  # pylint: disable=g-import-not-at-top,wrong-import-position

MLP = [
    '--config=configs/mlp.py', '--config.steps=1500', '--config.log_every=100'
]
CNN = [
    '--config=configs/mnist_cnn.py', '--config.steps=120',
    '--config.log_every=10', '--config.eval_every=0',
    '--config.checkpoint_every=0'
]


def _steps_per_sec(args: list[str], workdir: str) -> float:
  subprocess.run([
      sys.executable, '-m', 'launcher', *args, '--config.global_batch_size=256',
      '--config.checkpointing=False', f'--workdir={workdir}'
  ],
                 cwd=REPO,
                 capture_output=True,
                 text=True,
                 check=True,
                 timeout=1800,
                 env={
                     k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'
                 })
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rates = [
        r['steps_per_sec'] for r in map(json.loads, f) if 'steps_per_sec' in r
    ]
  return statistics.median(rates[1:])


def _cases(data_dir: str) -> dict[str, list[str]]:
  cnn = [*CNN, f'--config.data_dir={data_dir}']
  return {
      'mlp_k1': [*MLP, '--local_devices=8'],
      'mlp_k2': [*MLP, '--local_devices=8', '--config.microbatches=2'],
      'mlp_k4': [*MLP, '--local_devices=8', '--config.microbatches=4'],
      'cnn_k1': [*cnn, '--local_devices=8'],
      'cnn_k2': [*cnn, '--local_devices=8', '--config.microbatches=2'],
      'cnn_k4': [*cnn, '--local_devices=8', '--config.microbatches=4'],
      'mlp_24_devices': [*MLP, '--local_devices=24'],
      'mlp_32_devices': [*MLP, '--local_devices=32'],
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--out', default='')
  args = parser.parse_args()
  from runtime.workloads import mnist  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as tmp:
    mnist.write_synthetic(os.path.join(tmp, 'digits'),
                          num_train=4096,
                          num_test=256)
    cases = _cases(os.path.join(tmp, 'digits'))
    rounds = {name: [] for name in cases}
    for i in range(args.rounds):
      for name, case in cases.items():
        rate = _steps_per_sec(case, os.path.join(tmp, f'{name}_{i}'))
        rounds[name].append({'steps_per_sec': rate})
  results = {'rounds': args.rounds}
  side_by_side.report(results, rounds, '', baseline=None)
  ratios = {
      'mlp_k2_over_k1':
          results['mlp_k2']['steps_per_sec'] /
          results['mlp_k1']['steps_per_sec'],
      'mlp_k4_over_k1':
          results['mlp_k4']['steps_per_sec'] /
          results['mlp_k1']['steps_per_sec'],
      'cnn_k2_over_k1':
          results['cnn_k2']['steps_per_sec'] /
          results['cnn_k1']['steps_per_sec'],
      'cnn_k4_over_k1':
          results['cnn_k4']['steps_per_sec'] /
          results['cnn_k1']['steps_per_sec'],
      '24_over_32_devices':
          results['mlp_24_devices']['steps_per_sec'] /
          results['mlp_32_devices']['steps_per_sec']
  }
  print(json.dumps(ratios, indent=2))
  if args.out:
    pathlib.Path(args.out).write_text(
        json.dumps({
            **results,
            **ratios
        }, indent=2) + '\n')


if __name__ == '__main__':
  main()
