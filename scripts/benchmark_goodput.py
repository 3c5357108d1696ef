"""Goodput of a preempted job, with and without the compilation cache.

The MNIST MLP (synthetic files of MNIST's shapes) on a 2 x 4 local pod with
--max_restarts: every --every steps rank 1 gets SIGTERM (a preemption
notice), every process saves the agreed step and exits 75, and the launcher
starts the job again, which resumes from that checkpoint. Each round runs
the job with JAX's persistent compilation cache (the default) and without
it (--compilation_cache_dir=''), alternating which goes first, and reports
from the goodput ledger (runtime/common/goodput.py): goodput, every category,
and the restart-to-first-step time (from a restarted attempt's launch to its
first completed step).

  python scripts/benchmark_goodput.py [--rounds=3] [--steps=300] [--every=100]
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from launcher.common import goodput_rollup  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.common import layout  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.common import records  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.workloads import mnist  # pylint: disable=g-import-not-at-top,wrong-import-position


def _env():
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')
  }
  env['PYTHONPATH'] = REPO
  return env


def _preempt_every(workdir: str, every: int, stop: threading.Event) -> None:
  """Sends SIGTERM to rank 1 each time rank 0's log passes a multiple."""
  log = os.path.join(workdir, 'logs', 'rank_0.log')
  target = every
  while not stop.is_set():
    time.sleep(0.05)
    try:
      with open(log) as f:
        steps = [int(s) for s in re.findall(r'step (\d+)/', f.read())]
      with open(os.path.join(workdir, 'logs', 'job.json')) as f:
        pid = json.load(f)['ranks'][1]['pid']
    except (OSError, ValueError, KeyError, IndexError):
      continue
    if steps and max(steps) >= target:
      try:
        os.kill(pid, signal.SIGTERM)
      except ProcessLookupError:
        continue
      target += every


def run_job(workdir: str, data_dir: str, steps: int, every: int,
            cache: bool) -> dict:
  stop = threading.Event()
  watcher = threading.Thread(target=_preempt_every,
                             args=(workdir, every, stop),
                             daemon=True)
  watcher.start()
  args = [
      sys.executable, '-m', 'launcher', '--config=configs/mnist.py',
      f'--config.data_dir={data_dir}', f'--config.steps={steps}',
      '--config.log_every=10', '--config.eval_every=0',
      '--config.checkpoint_every=50', f'--workdir={workdir}',
      '--local_processes=2', '--local_devices=4', '--max_restarts=20',
      '--restart_backoff=1'
  ]
  if not cache:
    args.append('--compilation_cache_dir=')
  try:
    subprocess.run(args,
                   cwd=REPO,
                   env=_env(),
                   check=True,
                   timeout=1800,
                   capture_output=True)
  finally:
    stop.set()
    watcher.join()
  result = goodput_rollup.rollup(layout.Record(workdir))
  launched = {
      a.name: a for a in records.read_attempts(
          os.path.join(workdir, 'logs', layout.ATTEMPTS))
  }
  first_steps = {
      a['name']: records.Notes.from_json(a['notes']).first_step_wall
      for a in result['attempts'][1:]
  }
  restarts = [
      wall - launched[name].started
      for name, wall in first_steps.items()
      if wall is not None and name in launched
  ]
  return {
      'goodput': result['goodput'],
      'wall_s': result['wall_s'],
      'attempts': len(result['attempts']),
      'parts': result['parts'],
      'restart_to_first_step_s': restarts
  }


def _spread(values):
  return {
      'median': statistics.median(values),
      'min': min(values),
      'max': max(values)
  }


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--every', type=int, default=100)
  parser.add_argument('--out', default='')
  args = parser.parse_args()
  runs = {True: [], False: []}
  with tempfile.TemporaryDirectory() as tmp:
    data_dir = os.path.join(tmp, 'mnist')
    mnist.write_synthetic(data_dir, num_train=20000, num_test=1000)
    for i in range(args.rounds):
      for cache in ((True, False) if i % 2 == 0 else (False, True)):
        runs[cache].append(
            run_job(os.path.join(tmp, f'{cache}_{i}'), data_dir, args.steps,
                    args.every, cache))
  report = {
      'rounds': args.rounds,
      'steps': args.steps,
      'preempt_every': args.every
  }
  for cache, name in ((True, 'with_cache'), (False, 'without_cache')):
    rows = runs[cache]
    report[name] = {
        'goodput':
            _spread([r['goodput'] for r in rows]),
        'wall_s':
            _spread([r['wall_s'] for r in rows]),
        'attempts': [r['attempts'] for r in rows],
        'restart_to_first_step_s':
            _spread([t for r in rows for t in r['restart_to_first_step_s']]),
        'parts_median_s': {
            p: statistics.median(r['parts'][p] for r in rows)
            for p in rows[0]['parts']
        },
    }
  print(json.dumps(report, indent=2))
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(report, f, indent=2)


if __name__ == '__main__':
  main()
