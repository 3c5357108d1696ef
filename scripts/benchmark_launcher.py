"""Measures the local-pod launcher's costs against doing without it.

- start-up: wall time from starting 2 processes x 4 devices to the end of a
  one-step job, with the launcher against scripts/bare_distributed.py run by
  hand (alternated, several rounds, medians);
- failure to exit: from the moment a rank exits with code 7 at step 3 to the
  moment the launcher has torn the job down and exited.

  python scripts/benchmark_launcher.py [--rounds=5] [--out=FILE.json]
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
  env = {k: v for k, v in os.environ.items()
         if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')}
  env['PYTHONPATH'] = REPO
  return env


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def time_bare(processes=2):
  port = _free_port()
  start = time.perf_counter()
  procs = [subprocess.Popen(
      [sys.executable, os.path.join(REPO, 'scripts', 'bare_distributed.py'),
       f'--process_id={i}', f'--num_processes={processes}', f'--port={port}'],
      env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
      start_new_session=True) for i in range(processes)]
  codes = [p.wait(timeout=300) for p in procs]
  assert codes == [0] * processes, codes
  return time.perf_counter() - start


def time_launcher(workdir, processes=2):
  start = time.perf_counter()
  subprocess.run(
      [sys.executable, '-m', 'launcher', '--config=configs/linear_regression.py',
       f'--workdir={workdir}', f'--local_processes={processes}',
       '--local_devices=4', '--config.steps=1'],
      cwd=REPO, env=_env(), check=True, timeout=300, capture_output=True)
  return time.perf_counter() - start


def time_failure_to_exit(workdir):
  result = subprocess.run(
      [sys.executable, '-m', 'launcher',
       '--config=tests/workloads/probe_config.py', f'--workdir={workdir}',
       '--local_processes=2', '--config.steps=1000000',
       '--config.fail_rank=1', '--config.fail_step=3',
       '--config.fail_code=7'],
      cwd=REPO, env=_env(), timeout=300, capture_output=True, text=True)
  exited = time.time()
  assert result.returncode == 7, result.stderr[-2000:]
  with open(os.path.join(workdir, 'logs', 'rank_1.log')) as f:
    failed = float(re.search(r'probe: exiting at ([\d.]+)', f.read()).group(1))
  return exited - failed


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--out', default='', help='Also write the JSON here.')
  args = parser.parse_args()
  bare, launched, failure = [], [], []
  with tempfile.TemporaryDirectory() as tmp:
    for i in range(args.rounds):
      bare.append(time_bare())
      launched.append(time_launcher(os.path.join(tmp, f'run{i}')))
      failure.append(time_failure_to_exit(os.path.join(tmp, f'fail{i}')))
  report = {
      'rounds': args.rounds,
      'bare_2x4_one_step_s': statistics.median(bare),
      'launcher_2x4_one_step_s': statistics.median(launched),
      'launcher_overhead_s': statistics.median(launched) - statistics.median(bare),
      'failure_to_exit_s': statistics.median(failure),
      'failure_to_exit_max_s': max(failure),
      'all': {'bare': bare, 'launcher': launched, 'failure_to_exit': failure},
  }
  print(json.dumps(report, indent=2))
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(report, f, indent=2)


if __name__ == '__main__':
  main()
