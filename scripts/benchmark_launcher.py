"""Measures the launcher's start-up, how fast faults end a job, and what
supervision costs.

- start-up: wall time from starting 2 processes x 4 devices to the end of a
  one-step job, with the launcher against scripts/bare_distributed.py run by
  hand (alternated, several rounds, medians);
- detection latency: for each fault (rank 1 exits 7, raises, is SIGKILLed,
  hangs in its input), from the fault to the exit of the last process of
  the job, in cluster mode (2 processes started by hand with explicit
  coordinator flags, nothing supervising them) and in a local pod (2
  processes); --heartbeat_timeout=5 and --stall_timeout=5;
- supervision cost: training steps/s of the MLP in cluster mode with the
  per-rank supervision on and off (--nosupervision), alternated.

  python scripts/benchmark_launcher.py [--rounds=5] [--out=FILE.json]
"""

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = '--config=tests/workloads/probe_config.py'
HEARTBEAT_S = 5
STALL_S = 5
# Each fault: the probe flags that cause it (None: SIGKILL from outside).
FAULTS = {
    'crash_exit_7': ['--config.fail_mode=exit', '--config.fail_code=7'],
    'exception': ['--config.fail_mode=raise'],
    'lost_sigkill': None,
    'hung_input': ['--config.fail_mode=hang'],
}


def _env():
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')
  }
  env['PYTHONPATH'] = REPO
  return env


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def time_bare(processes=2):
  port = _free_port()
  start = time.perf_counter()
  procs = [
      subprocess.Popen([
          sys.executable,
          os.path.join(REPO, 'scripts', 'bare_distributed.py'),
          f'--process_id={i}', f'--num_processes={processes}', f'--port={port}'
      ],
                       env=_env(),
                       stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL,
                       start_new_session=True) for i in range(processes)
  ]
  codes = [p.wait(timeout=300) for p in procs]
  assert codes == [0] * processes, codes
  return time.perf_counter() - start


def time_launcher(workdir, processes=2):
  start = time.perf_counter()
  subprocess.run([
      sys.executable, '-m', 'launcher', '--config=configs/linear_regression.py',
      f'--workdir={workdir}', f'--local_processes={processes}',
      '--local_devices=4', '--config.steps=1'
  ],
                 cwd=REPO,
                 env=_env(),
                 check=True,
                 timeout=300,
                 capture_output=True)
  return time.perf_counter() - start


def _start(args, workdir, log_name):
  log = open(os.path.join(workdir, log_name), 'w+')
  proc = subprocess.Popen(
      [sys.executable, '-u', '-m', 'launcher', *args, f'--workdir={workdir}'],
      cwd=REPO,
      env=_env(),
      stdin=subprocess.DEVNULL,
      stdout=log,
      stderr=subprocess.STDOUT,
      start_new_session=True)
  return proc, log


def _cluster(args, workdir, processes=2):
  address = f'127.0.0.1:{_free_port()}'
  return [
      _start([
          *args, '--local_devices=1', f'--coordinator_address={address}',
          f'--coordinator_bind_address={address}',
          f'--num_processes={processes}', f'--process_id={i}'
      ], workdir, f'rank_{i}.out') for i in range(processes)
  ]


def _wait_all(procs, timeout=120):
  """Waits for every process; returns the wall time of the last exit."""
  deadline = time.monotonic() + timeout
  last = None
  while any(p.poll() is None for p, _ in procs):
    if time.monotonic() > deadline:
      for p, _ in procs:
        os.killpg(p.pid, signal.SIGKILL)
      raise RuntimeError('a job outlived the benchmark\'s timeout')
    time.sleep(0.01)
    last = time.time()
  for _, log in procs:
    log.close()
  return last or time.time()


def _wait_for_step(path, step=10, timeout=90):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if os.path.exists(path) and f'step {step}/' in open(path).read():
      return
    time.sleep(0.05)
  raise RuntimeError(f'no step {step} in {path}')


def detection_latency(fault, mode, workdir):
  """Seconds from `fault` on rank 1 to the exit of the job's last process."""
  os.makedirs(workdir)
  args = [
      PROBE, '--config.steps=1000000', '--config.checkpointing=False',
      f'--heartbeat_timeout={HEARTBEAT_S}', f'--stall_timeout={STALL_S}'
  ]
  if FAULTS[fault] is not None:
    args += ['--config.fail_rank=1', '--config.fail_step=30', *FAULTS[fault]]
  if mode == 'cluster':
    procs = _cluster(args, workdir)
    rank_1_output = os.path.join(workdir, 'rank_1.out')
    rank_0_output = os.path.join(workdir, 'rank_0.out')
  else:
    procs = [
        _start([*args, '--local_processes=2', '--local_devices=1'], workdir,
               'launcher.out')
    ]
    rank_1_output = os.path.join(workdir, 'logs', 'rank_1.log')
    rank_0_output = os.path.join(workdir, 'logs', 'rank_0.log')
  if FAULTS[fault] is None:
    _wait_for_step(rank_0_output)
    if mode == 'cluster':
      victim = procs[1][0].pid
    else:
      with open(os.path.join(workdir, 'logs', 'job.json')) as f:
        victim = json.load(f)['ranks'][1]['pid']
    fault_at = time.time()
    os.kill(victim, signal.SIGKILL)
    ended = _wait_all(procs)
  else:
    ended = _wait_all(procs)
    with open(rank_1_output) as f:
      fault_at = float(re.search(r'probe: \w+ at ([\d.]+)', f.read()).group(1))
  return ended - fault_at


def steps_per_sec(supervision, workdir):
  """(steps/s, supervisor CPU s per wall s) of an MLP run in cluster mode,
  2 processes: the steps after the first over their wall time."""
  os.makedirs(workdir)
  args = [
      '--config=configs/mlp.py', '--config.steps=2000',
      '--config.log_every=100', '--config.checkpointing=False',
      '--supervision' if supervision else '--nosupervision'
  ]
  _wait_all(_cluster(args, workdir), timeout=600)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [json.loads(l) for l in f]
  timed = [r for r in records if r.get('steps_per_sec')]
  # Every window but the first (compilation) has 100 steps.
  seconds = sum(100 / r['steps_per_sec'] for r in timed)
  with open(os.path.join(workdir, 'summary.json')) as f:
    ranks = json.load(f)['ranks']
  cpu = [r.get('supervisor_cpu_s') or 0.0 for r in ranks]
  return 100 * len(timed) / seconds, max(cpu, default=0.0) / seconds


def _spread(values):
  return {
      'median': statistics.median(values),
      'max': max(values),
      'min': min(values),
      'all': values
  }


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--out', default='', help='Also write the JSON here.')
  args = parser.parse_args()
  bare, launched = [], []
  latency = {f'{m}/{f}': [] for m in ('cluster', 'local_pod') for f in FAULTS}
  with_sup, without_sup, watcher_cpu = [], [], []
  with tempfile.TemporaryDirectory() as tmp:
    for i in range(args.rounds):
      bare.append(time_bare())
      launched.append(time_launcher(os.path.join(tmp, f'run{i}')))
      for key in latency:
        mode, fault = key.split('/')
        latency[key].append(
            detection_latency(fault, mode,
                              os.path.join(tmp, f'{mode}_{fault}_{i}')))
      # Alternate the order so that neither side always runs first.
      for supervision in ((True, False) if i % 2 == 0 else (False, True)):
        rate, cpu = steps_per_sec(supervision,
                                  os.path.join(tmp, f'rate_{supervision}_{i}'))
        (with_sup if supervision else without_sup).append(rate)
        if supervision:
          watcher_cpu.append(cpu)
  ratios = [a / b for a, b in zip(with_sup, without_sup)]
  report = {
      'rounds':
          args.rounds,
      'heartbeat_timeout_s':
          HEARTBEAT_S,
      'stall_timeout_s':
          STALL_S,
      'bare_2x4_one_step_s':
          statistics.median(bare),
      'launcher_2x4_one_step_s':
          statistics.median(launched),
      'launcher_overhead_s':
          statistics.median(launched) - statistics.median(bare),
      'detection_latency_s': {
          k: _spread(v) for k, v in latency.items()
      },
      'supervised_vs_unsupervised_steps_per_sec':
          _spread(ratios),
      'supervisor_cpu_per_wall_s':
          _spread(watcher_cpu),
      'steps_per_sec': {
          'supervised': with_sup,
          'unsupervised': without_sup
      },
      'all': {
          'bare': bare,
          'launcher': launched
      },
  }
  print(json.dumps(report, indent=2))
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(report, f, indent=2)


if __name__ == '__main__':
  main()
