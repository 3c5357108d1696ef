"""Measures the runtime's training speed against what it should reach.

  python scripts/benchmark.py [--rounds=5] [--steps=200] [--out=benchmark.json]

MNIST MLP (configs/mnist.py: 784-512-512-10, Adam, global batch 256) and
the Flax CNN (configs/mnist_cnn.py: BatchNorm, dropout, model state), on
`config.data_dir` when the real files are there, else on synthetic files of
the same shapes. All figures are examples per second after compilation (the
first step of each run is left out), and every ratio is the median over
`--rounds` rounds whose runs alternate, so slow drift of the machine cancels:

- runtime_vs_bare: `runtime.train` (pmap, prefetch, its hooks: metrics,
  TensorBoard, preemption agreement, progress) over a minimal hand-written
  loop that reads each batch, places it on the devices and runs the same pmap
  step, blocking on each step as the runtime does on CPU, in the same
  process; cnn_runtime_vs_bare the same for the CNN (--cnn_steps a run);
- shard_map_vs_pmap: `runtime.train` with config.parallelism="shard_map" over
  the same with "pmap";
- input_wait_fraction: the share of the runtime's step time spent waiting for
  its next batch (pmap);
- multiprocess_vs_inprocess: a local pod of 2 processes x 4 emulated CPU
  devices over one process with 8, both started by the launcher, same global
  batch;
- shard_map_vs_pmap_2x4: shard_map over pmap in that local pod.

Prints one JSON object and writes it to --out.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ml_collections import ConfigDict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

TARGETS = {
    'runtime_vs_bare': ('>=', 0.98),
    'cnn_runtime_vs_bare': ('>=', 0.98),
    'input_wait_fraction': ('<', 0.02),
    'shard_map_vs_pmap': ('>=', 1.0),
    'shard_map_vs_pmap_2x4': ('>=', 1.0),
}


def _mnist_config(args):
  from configs import mnist as mnist_config  # pylint: disable=g-import-not-at-top
  config = mnist_config.get_config()
  config.data_dir = args.data_dir
  config.steps = args.steps
  config.log_every = args.steps
  config.eval_every = 0
  config.checkpointing = False
  return config


def _cnn_config(args):
  from configs import mnist_cnn as cnn_config  # pylint: disable=g-import-not-at-top
  config = cnn_config.get_config()
  config.data_dir = args.data_dir
  config.steps = config.log_every = args.cnn_steps
  config.eval_every = 0
  config.checkpointing = False
  return config


def _bare_examples_per_sec(config: ConfigDict, task) -> float:
  """The hand-written loop: same step, same batches, nothing else."""
  from runtime import data  # pylint: disable=g-import-not-at-top
  from runtime import parallelism  # pylint: disable=g-import-not-at-top
  from runtime import randomness  # pylint: disable=g-import-not-at-top
  from runtime import step as step_lib  # pylint: disable=g-import-not-at-top

  par = parallelism.PMAP
  step_fn = step_lib.make_train_step(task.loss_fn,
                                     task.optimizer,
                                     par,
                                     rng=randomness.contract(
                                         task.rng, task.loss_uses_rng),
                                     has_model_state=task.model_state
                                     is not None)
  state = par.replicate(
      step_lib.init_state(task.params, task.optimizer, config.seed,
                          task.model_state))
  started = None
  for step in range(config.steps):
    ids = data.process_batch_ids(step, config.global_batch_size, len(task.data),
                                 config.seed, 0, 1)
    batch = par.put_batch(data.read_batch(task.data, ids))
    state, metrics = step_fn(state, batch)
    float(metrics['loss'])  # One step in flight, as on CPU it must be.
    if started is None:
      started = time.perf_counter()
  elapsed = time.perf_counter() - started
  return (config.steps - 1) * config.global_batch_size / elapsed


def _runtime_run(config: ConfigDict, task, kind, workdir) -> dict[str, float]:
  from runtime import training  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  config.parallelism = kind
  training.train(config, workdir, task)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    record = [json.loads(line) for line in f][-1]
  return {
      'examples_per_sec': record['examples_per_sec'],
      'input_wait_fraction': record['input_wait_fraction']
  }


def in_process(args) -> dict:
  """Runs in a child with 8 emulated devices; returns per-round figures."""
  from launcher.process import devices  # pylint: disable=g-import-not-at-top
  devices.configure(None, multi_process=False)
  import dataclasses  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  from runtime.workloads import mnist  # pylint: disable=g-import-not-at-top
  from runtime.workloads import mnist_cnn  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)

  config = _mnist_config(args)
  dataset = mnist.load(config.data_dir)
  task = dataclasses.replace(mnist.make_task(config, dataset), eval_fn=None)
  cnn_config = _cnn_config(args)
  cnn_task = dataclasses.replace(mnist_cnn.make_task(cnn_config, dataset),
                                 eval_fn=None)
  rounds = []
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
      runs = {
          'bare':
              lambda: {
                  'examples_per_sec': _bare_examples_per_sec(config, task)
              },
          'pmap':
              lambda r=r: _runtime_run(config, task, 'pmap',
                                       os.path.join(tmp, f'pmap{r}')),
          'shard_map':
              lambda r=r: _runtime_run(config, task, 'shard_map',
                                       os.path.join(tmp, f'shard_map{r}')),
          'cnn_bare':
              lambda: {
                  'examples_per_sec':
                      _bare_examples_per_sec(cnn_config, cnn_task)
              },
          'cnn_pmap':
              lambda r=r: _runtime_run(cnn_config, cnn_task, 'pmap',
                                       os.path.join(tmp, f'cnn{r}')),
      }
      order = list(runs) if r % 2 == 0 else list(reversed(runs))
      rounds.append({name: runs[name]() for name in order})
      print(f'in-process round {r + 1}/{args.rounds}: ' + json.dumps({
          k: round(v['examples_per_sec']) for k, v in rounds[-1].items()
      }),
            file=sys.stderr,
            flush=True)
  return {
      'rounds': rounds,
      'jax_version': jax.__version__,
      'device_kind': jax.devices()[0].device_kind,
      'platform': jax.devices()[0].platform,
      'device_count': jax.device_count()
  }


def _launch(args, pod: list[str], workdir: str) -> float:
  """examples/s of one launcher run, read from its metrics.jsonl."""
  command = [
      sys.executable, '-m', 'launcher', '--config=configs/mnist.py',
      f'--config.data_dir={args.data_dir}', f'--config.steps={args.steps}',
      f'--config.log_every={args.steps}', '--config.eval_every=0',
      '--config.checkpointing=False', f'--workdir={workdir}', *pod
  ]
  result = subprocess.run(command,
                          cwd=REPO,
                          capture_output=True,
                          text=True,
                          timeout=args.timeout,
                          check=False)
  if result.returncode:
    raise RuntimeError(f'{" ".join(command)} exited {result.returncode}:\n'
                       f'{result.stderr[-3000:]}')
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  return [r for r in records if 'examples_per_sec' in r][-1]['examples_per_sec']


def multi_process(args) -> list[dict[str, float]]:
  two_by_four = ['--local_processes=2', '--local_devices=4']
  pods = {
      '1x8': ['--local_devices=8'],
      '2x4': two_by_four,
      '2x4_shard_map': [*two_by_four, '--config.parallelism=shard_map']
  }
  rounds = []
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
      order = list(pods) if r % 2 == 0 else list(reversed(pods))
      rounds.append({
          name: _launch(args, pods[name], os.path.join(tmp, f'{name}_{r}'))
          for name in order
      })
      print(f'launcher round {r + 1}/{args.rounds}: ' + json.dumps({
          k: round(v) for k, v in rounds[-1].items()
      }),
            file=sys.stderr,
            flush=True)
  return rounds


def _median(values):
  return statistics.median(values)


def summarize(inproc: dict, launched: list[dict], args, data: str) -> dict:
  rounds = inproc['rounds']

  def speeds(name):
    return [r[name]['examples_per_sec'] for r in rounds]

  ranges = {}

  def ratio(a, b, source):
    values = [x[a] / x[b] for x in source]
    ranges[f'{a}/{b}'] = [min(values), max(values)]
    return _median(values)

  flat = [{k: v['examples_per_sec'] for k, v in r.items()} for r in rounds]
  result = {
      'runtime_vs_bare':
          ratio('pmap', 'bare', flat),
      'cnn_runtime_vs_bare':
          ratio('cnn_pmap', 'cnn_bare', flat),
      'shard_map_vs_pmap':
          ratio('shard_map', 'pmap', flat),
      'input_wait_fraction':
          _median([r['pmap']['input_wait_fraction'] for r in rounds]),
      'multiprocess_vs_inprocess':
          ratio('2x4', '1x8', launched),
      'shard_map_vs_pmap_2x4':
          ratio('2x4_shard_map', '2x4', launched),
      'examples_per_sec': {
          'bare_pmap':
              _median(speeds('bare')),
          'runtime_pmap':
              _median(speeds('pmap')),
          'runtime_shard_map':
              _median(speeds('shard_map')),
          'cnn_bare_pmap':
              _median(speeds('cnn_bare')),
          'cnn_runtime_pmap':
              _median(speeds('cnn_pmap')),
          'launcher_1x8':
              _median([r['1x8'] for r in launched]),
          'launcher_2x4':
              _median([r['2x4'] for r in launched]),
          'launcher_2x4_shard_map':
              _median([r['2x4_shard_map'] for r in launched]),
      },
      'input_wait_fraction_shard_map':
          _median([r['shard_map']['input_wait_fraction'] for r in rounds]),
      'ratio_ranges':
          ranges,
      'rounds': {
          'in_process': rounds,
          'launcher': launched
      },
      'workload':
          'configs/mnist.py (MLP 784-512-512-10, Adam, global batch '
          f'256), {args.steps} steps per run; configs/mnist_cnn.py, '
          f'{args.cnn_steps} steps per run; {data} data',
      'jax_version':
          inproc['jax_version'],
      'device_kind':
          inproc['device_kind'],
      'platform':
          inproc['platform'],
      'device_count':
          inproc['device_count'],
      'cpu_count':
          os.cpu_count(),
  }
  result['targets'] = {
      name: {
          'target': f'{op} {bound}',
          'value': result[name],
          'met': result[name] >= bound if op == '>=' else result[name] < bound
      } for name, (op, bound) in TARGETS.items()
  }
  return result


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--steps',
                      type=int,
                      default=200,
                      help='steps per run (the first is left out)')
  parser.add_argument('--cnn_steps',
                      type=int,
                      default=40,
                      help='steps per CNN run (the first is left out)')
  parser.add_argument('--data_dir',
                      default=os.path.join(REPO, 'data/mnist'),
                      help='MNIST IDX files; synthetic ones are written to a '
                      'temporary directory when these are missing')
  parser.add_argument('--out', default='benchmark.json')
  parser.add_argument('--timeout',
                      type=float,
                      default=600,
                      help='seconds one launcher run may take')
  parser.add_argument('--_in_process',
                      action='store_true',
                      help=argparse.SUPPRESS)
  args = parser.parse_args()

  if args._in_process:  # pylint: disable=protected-access
    json.dump(in_process(args), sys.stdout)
    return 0

  with tempfile.TemporaryDirectory() as tmp:
    from runtime.workloads import mnist  # pylint: disable=g-import-not-at-top
    data = 'real MNIST'
    try:
      mnist.load(args.data_dir)
    except (OSError, ValueError):
      data = 'synthetic MNIST-shaped (60000 train)'
      args.data_dir = os.path.join(tmp, 'mnist')
      mnist.write_synthetic(args.data_dir)
    child = subprocess.run([
        sys.executable,
        os.path.abspath(__file__), '--_in_process', f'--rounds={args.rounds}',
        f'--steps={args.steps}', f'--cnn_steps={args.cnn_steps}',
        f'--data_dir={args.data_dir}'
    ],
                           cwd=REPO,
                           stdout=subprocess.PIPE,
                           text=True,
                           timeout=args.timeout * args.rounds,
                           check=True)
    inproc = json.loads(child.stdout)
    launched = multi_process(args)
    result = summarize(inproc, launched, args, data)
  text = json.dumps(result, indent=2)
  print(text)
  with open(args.out, 'w') as f:
    f.write(text + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
