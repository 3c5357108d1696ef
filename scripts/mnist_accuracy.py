"""The CNN's test accuracy against the MLP's, each trained by the launcher.

  python scripts/fetch_mnist.py --data_dir=data/mnist   # real MNIST, needs internet
  python scripts/mnist_accuracy.py --data_dir=data/mnist [-- --local_processes=2 ...]

Runs configs/mnist.py and configs/mnist_cnn.py on the same IDX files, one
after the other, and prints each one's exact test-split accuracy and loss
(every test example once) and its wall time, as JSON. Flags after `--` go
to both launcher runs (`--config.steps=...`, a local pod...).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {'mlp': 'configs/mnist.py', 'cnn': 'configs/mnist_cnn.py'}


def run(config: str, data_dir: str, workdir: str, extra: list[str]) -> dict:
  command = [
      sys.executable, '-m', 'launcher', f'--config={config}',
      f'--config.data_dir={os.path.abspath(data_dir)}', f'--workdir={workdir}',
      *extra
  ]
  started = time.perf_counter()
  result = subprocess.run(command,
                          cwd=REPO,
                          capture_output=True,
                          text=True,
                          check=False)
  if result.returncode:
    sys.exit(f'{" ".join(command)} exited {result.returncode}:\n'
             f'{result.stderr[-3000:]}')
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  return {
      **summary['results']['eval'], 'steps': summary['steps'],
      'wall_s': round(time.perf_counter() - started, 1)
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--data_dir', default='data/mnist')
  parser.add_argument('--workdir',
                      default='',
                      help='keeps the runs in WORKDIR/{mlp,cnn}; default: a '
                      'temporary directory')
  parser.add_argument('launcher_flags', nargs='*')
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    root = args.workdir or tmp
    results = {
        name:
            run(config, args.data_dir, os.path.join(root, name),
                args.launcher_flags) for name, config in CONFIGS.items()
    }
  print(json.dumps(results, indent=2))


if __name__ == '__main__':
  main()
