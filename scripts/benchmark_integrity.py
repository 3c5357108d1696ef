"""Measures what the replica check costs: steps/s with it over without.

  python scripts/benchmark_integrity.py [--rounds=5] [--steps=400] [--out=F]

The MNIST MLP (configs/mnist.py, global batch 256) on 8 emulated CPU devices
in one process, on synthetic files of MNIST's shapes, trained by
`runtime.train` with `config.integrity_every` at 0 (off), the default and
10, in alternating rounds; every figure is examples/s after compilation from
the run's last metrics record. Prints one JSON object: each cadence's
median ratio over off, and the rounds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def in_process(args) -> dict:
  """Runs in a child with 8 emulated devices; returns per-round figures."""
  from launcher.process import devices  # pylint: disable=g-import-not-at-top
  devices.configure(None, multi_process=False)
  import dataclasses  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  from configs import mnist as mnist_config  # pylint: disable=g-import-not-at-top
  from runtime import training  # pylint: disable=g-import-not-at-top
  from runtime.workloads import mnist  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  config = mnist_config.get_config()
  config.data_dir, config.steps = args.data_dir, args.steps
  config.log_every, config.eval_every = args.steps, 0
  config.checkpointing = False
  task = dataclasses.replace(mnist.make_task(config,
                                             mnist.load(config.data_dir)),
                             eval_fn=None)
  cadences = (0, mnist_config.get_config().integrity_every, 10)
  rounds = []
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
      order = cadences if r % 2 == 0 else tuple(reversed(cadences))
      figures = {}
      for every in order:
        run_config = config.copy_and_resolve_references()
        run_config.integrity_every = every
        workdir = os.path.join(tmp, f'{every}_{r}')
        training.train(run_config, workdir, task)
        with open(os.path.join(workdir, 'metrics.jsonl')) as f:
          figures[every] = [json.loads(l) for l in f][-1]['examples_per_sec']
      rounds.append(figures)
      print(f'round {r + 1}/{args.rounds}: {json.dumps(figures)}',
            file=sys.stderr,
            flush=True)
  return {
      'rounds': rounds,
      'jax_version': jax.__version__,
      'device_count': jax.device_count(),
      'cadences': cadences
  }


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--steps', type=int, default=400)
  parser.add_argument('--out', default='')
  parser.add_argument('--data_dir', default='')
  parser.add_argument('--_in_process',
                      action='store_true',
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args._in_process:  # pylint: disable=protected-access
    print(json.dumps(in_process(args)))
    return 0
  with tempfile.TemporaryDirectory() as data_dir:
    from runtime.workloads import mnist  # pylint: disable=g-import-not-at-top
    mnist.write_synthetic(data_dir)
    child = subprocess.run([
        sys.executable,
        os.path.abspath(__file__), '--_in_process', f'--rounds={args.rounds}',
        f'--steps={args.steps}', f'--data_dir={data_dir}'
    ],
                           cwd=REPO,
                           stdout=subprocess.PIPE,
                           text=True,
                           check=True)
  measured = json.loads(child.stdout)
  off = 0
  result = {
      'jax_version': measured['jax_version'],
      'steps_per_run': args.steps,
      'rounds': measured['rounds']
  }
  for every in measured['cadences'][1:]:
    ratios = [r[str(every)] / r[str(off)] for r in measured['rounds']]
    result[f'integrity_every_{every}_vs_off'] = statistics.median(ratios)
    result[f'integrity_every_{every}_range'] = [min(ratios), max(ratios)]
  print(json.dumps(result, indent=2))
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(result, f, indent=2)
  return 0


if __name__ == '__main__':
  sys.exit(main())
