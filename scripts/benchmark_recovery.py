"""What a hard failure costs, and what the local checkpoint tier saves.

The MNIST MLP (synthetic files of MNIST's shapes) on 2 processes x 4
emulated CPU devices, side by side in one run:

- sigkill: a 2 x 4 local pod, --max_restarts=1 --retry_exit_codes=137,
  persistent checkpoints every 1,000 steps; rank 1 SIGKILLed once rank 0
  has logged step --kill_at. Once with the local tier at its default
  cadence, once without it (local_checkpoint_every=0), and an undisturbed
  run. Reports the steps trained again, the time from the kill to the next
  attempt's first productive step with its phases
  (runtime/common/goodput.py), and whether the final parameters equal the undisturbed run's.
- cluster: the same job as two processes started by hand, restarted by a
  loop here, as a scheduler would; the survivor learns of the loss after
  --heartbeat_timeout.
- repeated: a SIGKILL every --every steps; goodput over the undisturbed
  run's.
- cost: steps/s of the training loop with checkpointing over without, the
  persistent tier at the config's cadence and the local tier every
  --cadences steps (the MLP; the CNN at 25, the default), and the loop's
  blocking per save as a fraction of a step.
- wedged: a rank whose input sleeps, default flags: the time from the hang
  to every process's exit 124; then --quiet_runs runs with saves,
  evaluations and a compilation mid-run, none of which may end as stalled,
  and the largest interval between steps they saw.

  python scripts/benchmark_recovery.py [--only=sigkill,cluster,...]
      [--steps=1000] [--kill_at=470] [--every=200] [--quiet_runs=20]
      [--cadences=10,25,50,100] [--rounds=2]
      [--out=FILE.json]
"""

import argparse
import glob
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from launcher.common import goodput_rollup  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.common import layout  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.common import records  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.workloads import mnist  # pylint: disable=g-import-not-at-top,wrong-import-position

POD = ['--local_processes=2', '--local_devices=4']
SECTIONS = ('sigkill', 'cluster', 'repeated', 'cost', 'wedged')


def _env(**extra: str) -> dict:
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')
  }
  env['PYTHONPATH'] = REPO
  env.update(extra)
  return env


def _mnist(data_dir: str, workdir: str, steps: int, *extra: str) -> list[str]:
  return [
      sys.executable, '-m', 'launcher', '--config=configs/mnist.py',
      f'--config.data_dir={data_dir}', f'--config.steps={steps}',
      '--config.log_every=10', '--config.eval_every=0',
      '--config.checkpoint_every=1000', f'--workdir={workdir}', *extra
  ]


def _logged_step(path: str) -> int:
  try:
    with open(path, errors='replace') as f:
      steps = [int(s) for s in re.findall(r'step (\d+)/', f.read())]
  except OSError:
    return 0
  return max(steps, default=0)


def _kill_at_steps(log: str, pid_of, targets: list[int], kills: list,
                   stop: threading.Event) -> None:
  """SIGKILLs pid_of() each time `log` passes the next of `targets`."""
  targets = list(targets)
  while targets and not stop.is_set():
    time.sleep(0.02)
    if _logged_step(log) < targets[0]:
      continue
    try:
      pid = pid_of()
      os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
      continue
    kills.append({'at': time.time(), 'step_logged': _logged_step(log)})
    targets.pop(0)


def _rank_pid(workdir: str, rank: int):

  def pid():
    with open(os.path.join(workdir, 'logs', 'job.json')) as f:
      return json.load(f)['ranks'][rank]['pid']

  return pid


def _fingerprint(workdir: str) -> str:
  with open(os.path.join(workdir, 'ranks', 'rank_0.json')) as f:
    return json.load(f)['fingerprint']['sha256']


def _outcome(workdir: str, kills: list) -> dict:
  """Goodput, recomputed steps and recovery per restart of a finished job."""
  result = goodput_rollup.rollup(layout.Record(workdir))
  restarts = []
  for attempt, kill in zip(result['attempts'][1:], kills):
    recovery = attempt.get('recovery') or {}
    notes = records.Notes.from_json(attempt['notes'])
    first_wall = (notes.first_productive.wall
                  if notes.first_productive else float('nan'))
    restarts.append({
        'kill_to_first_productive_s': first_wall - kill['at'],
        'recomputed_steps': notes.recomputed_steps or 0,
        'restore_tier': notes.restore_tier,
        'restore_step': notes.restore_step,
        'phases_s': recovery.get('phases'),
        'total_from_fault_s': recovery.get('total_s')
    })
  return {
      'goodput': result['goodput'],
      'wall_s': result['wall_s'],
      'attempts': len(result['attempts']),
      'restarts': restarts,
      'fingerprint': _fingerprint(workdir)
  }


def run_pod(workdir: str, data_dir: str, steps: int, targets: list[int], *extra:
            str) -> dict:
  """A local-pod job; rank 1 SIGKILLed as rank 0 logs each target step."""
  kills, stop = [], threading.Event()
  killer = threading.Thread(target=_kill_at_steps,
                            args=(os.path.join(workdir, 'logs', 'rank_0.log'),
                                  _rank_pid(workdir, 1), targets, kills, stop),
                            daemon=True)
  os.makedirs(workdir, exist_ok=True)
  killer.start()
  try:
    subprocess.run(_mnist(data_dir, workdir, steps, *POD,
                          f'--max_restarts={len(targets)}',
                          '--retry_exit_codes=137', *extra),
                   cwd=REPO,
                   env=_env(),
                   check=True,
                   timeout=1800,
                   capture_output=True)
  finally:
    stop.set()
    killer.join()
  return _outcome(workdir, kills)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _start_by_hand(workdir: str, data_dir: str, steps: int,
                   attempt: int) -> list[subprocess.Popen]:
  address = f'127.0.0.1:{_free_port()}'
  procs = []
  for rank in range(2):
    log = open(os.path.join(workdir, f'rank_{rank}.log'), 'a')
    log.write(f'===== attempt {attempt} =====\n')
    log.flush()
    procs.append(
        subprocess.Popen(
            _mnist(data_dir, workdir, steps, '--local_devices=4',
                   f'--coordinator_address={address}',
                   f'--coordinator_bind_address={address}', '--num_processes=2',
                   f'--process_id={rank}'),
            # One job id across restarts, as SLURM_JOB_ID is across requeues:
            # the restarted job takes over its own lease on the workdir.
            cwd=REPO,
            env=_env(PODRUN_JOB_ID=os.path.basename(workdir)),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True))
  return procs


def run_cluster(workdir: str,
                data_dir: str,
                steps: int,
                kill_at: int,
                max_attempts: int = 4) -> dict:
  """Processes started by hand; this loop restarts them until they finish."""
  os.makedirs(workdir, exist_ok=True)
  kills, codes = [], []
  for attempt in range(1, max_attempts + 1):
    procs = _start_by_hand(workdir, data_dir, steps, attempt)
    stop = threading.Event()
    killer = threading.Thread(
        target=_kill_at_steps,
        args=(os.path.join(workdir, 'rank_0.log'), lambda: procs[1].pid,
              [kill_at] if attempt == 1 else [], kills, stop),
        daemon=True)
    killer.start()
    try:
      codes.append([p.wait(timeout=1800) for p in procs])
    finally:
      stop.set()
      killer.join()
      for p in procs:
        if p.poll() is None:
          os.killpg(p.pid, signal.SIGKILL)
    if codes[-1] == [0, 0]:
      break
  return {**_outcome(workdir, kills), 'exit_codes': codes}


def _spread(values: list[float]) -> dict:
  return {
      'median': statistics.median(values),
      'min': min(values),
      'max': max(values)
  }


def bench_sigkill(tmp: str, data_dir: str, args) -> dict:
  """One SIGKILL, with and without the local tier, and undisturbed."""
  out = {}
  out['undisturbed'] = run_pod(os.path.join(tmp, 'undisturbed'), data_dir,
                               args.steps, [])
  out['local_tier'] = run_pod(os.path.join(tmp, 'local'), data_dir, args.steps,
                              [args.kill_at])
  out['no_local_tier'] = run_pod(os.path.join(tmp, 'no_local'), data_dir,
                                 args.steps, [args.kill_at],
                                 '--config.local_checkpoint_every=0')
  for name in ('local_tier', 'no_local_tier'):
    out[name]['same_parameters_as_undisturbed'] = (
        out[name]['fingerprint'] == out['undisturbed']['fingerprint'])
  return out


def bench_cluster(tmp: str, data_dir: str, args) -> dict:
  out = run_cluster(os.path.join(tmp, 'cluster'), data_dir, args.steps,
                    args.kill_at)
  straight = run_pod(os.path.join(tmp, 'cluster_undisturbed'), data_dir,
                     args.steps, [])
  out['same_parameters_as_undisturbed'] = (
      out['fingerprint'] == straight['fingerprint'])
  out['heartbeat_timeout_s'] = 15
  return out


def bench_repeated(tmp: str, data_dir: str, args) -> dict:
  """A SIGKILL every args.every steps against an undisturbed run."""
  targets = list(range(args.every, args.steps, args.every))
  straight = run_pod(os.path.join(tmp, 'rep_undisturbed'), data_dir, args.steps,
                     [])
  killed = run_pod(os.path.join(tmp, 'repeated'), data_dir, args.steps, targets)
  return {
      'kills': len(targets),
      'undisturbed_goodput': straight['goodput'],
      'goodput': killed['goodput'],
      'goodput_ratio': killed['goodput'] / straight['goodput'],
      'same_parameters_as_undisturbed':
          (killed['fingerprint'] == straight['fingerprint']),
      'restarts': killed['restarts']
  }


def _loop_speed(workdir: str, steps: int, saves: int) -> dict:
  """Steps/s of the loop (steps, their input wait and blocking saves), and
  the blocking per save as a fraction of a step, from process 0's ledger."""
  ledger = goodput_rollup.rollup(layout.Record(workdir))['ranks']
  parts = list(ledger.values())[0][0]
  step_s = parts['productive'] / steps
  loop_s = (parts['productive'] + parts['input_wait'] +
            parts['checkpoint_blocking'])
  return {
      'loop_steps_per_s':
          steps / loop_s,
      'blocking_per_save_steps':
          (parts['checkpoint_blocking'] / saves / step_s) if saves else 0.0
  }


def _cost_run(workdir: str, data_dir: str, config: str, steps: int,
              local_every: Optional[int]) -> dict:
  """One run; local_every None: no checkpointing at all."""
  args = [
      f'--config.local_checkpoint_every={local_every}'
      if local_every is not None else '--config.checkpointing=False'
  ]
  subprocess.run([
      sys.executable, '-m', 'launcher', f'--config={config}',
      f'--config.data_dir={data_dir}', f'--config.steps={steps}',
      '--config.eval_every=0', *args, f'--workdir={workdir}', *POD
  ],
                 cwd=REPO,
                 env=_env(),
                 check=True,
                 timeout=1800,
                 capture_output=True)
  every = _config_every(config)
  saves = 0 if local_every is None else len({
      s for s in range(1, steps + 1)
      if (local_every and s % local_every == 0) or s % every == 0 or s == steps
  })
  return _loop_speed(workdir, steps, saves)


def _config_every(config: str) -> int:
  return 250 if config.endswith('mnist_cnn.py') else 500


def bench_cost(tmp: str, data_dir: str, args) -> dict:
  """Checkpointing at several local cadences (the persistent tier at its
  default) over none, for the MLP; the default cadence for the CNN too.
  Rounds alternate the order of the runs."""
  out = {}
  cadences = [int(c) for c in args.cadences.split(',')]
  mlp_steps, cnn_steps = (int(n) for n in args.cost_steps.split(','))
  for name, config, steps, tried in (('mlp', 'configs/mnist.py', mlp_steps,
                                      cadences), ('cnn', 'configs/mnist_cnn.py',
                                                  cnn_steps, [25])):
    rows = {c: [] for c in [None] + tried}
    for i in range(args.rounds):
      order = list(rows) if i % 2 == 0 else list(reversed(rows))
      for cadence in order:
        rows[cadence].append(
            _cost_run(os.path.join(tmp, f'cost_{name}_{cadence}_{i}'), data_dir,
                      config, steps, cadence))
    out[name] = {'steps': steps, 'persistent_every': _config_every(config)}
    for cadence in tried:
      ratios = [
          a['loop_steps_per_s'] / b['loop_steps_per_s']
          for a, b in zip(rows[cadence], rows[None])
      ]
      out[name][f'local_every_{cadence}'] = {
          'with_over_without':
              _spread(ratios),
          'blocking_per_save_steps':
              _spread([r['blocking_per_save_steps'] for r in rows[cadence]])
      }
  return out


def _hang_to_exit(tmp: str) -> dict:
  """Rank 1's input sleeps from step 300 on; default flags."""
  workdir = os.path.join(tmp, 'wedged')
  result = subprocess.run([
      sys.executable, '-m', 'launcher',
      '--config=tests/workloads/probe_config.py', '--config.steps=100000',
      '--config.log_every=100', '--config.fail_rank=1',
      '--config.fail_step=300', '--config.fail_mode=hang',
      f'--workdir={workdir}', *POD
  ],
                          cwd=REPO,
                          env=_env(),
                          capture_output=True,
                          text=True,
                          timeout=1800,
                          check=False)
  ended = time.time()
  with open(os.path.join(workdir, 'logs', 'rank_1.log'), errors='replace') as f:
    hung = float(re.search(r'probe: hang at ([\d.]+)', f.read()).group(1))
  stalled = [l for l in result.stderr.splitlines() if 'the job stalled' in l]
  return {
      'exit_code': result.returncode,
      'hang_to_launcher_exit_s': ended - hung,
      'message': stalled[0][-400:] if stalled else ''
  }


def _quiet_run(tmp: str, data_dir: str, i: int) -> dict:
  """Saves, evaluations (a compilation of their own mid-run): no stall."""
  workdir = os.path.join(tmp, f'quiet_{i}')
  code = subprocess.run(_mnist(data_dir, workdir, 400,
                               '--config.eval_every=100',
                               '--config.checkpoint_every=150', *POD),
                        cwd=REPO,
                        env=_env(),
                        capture_output=True,
                        timeout=1800,
                        check=False).returncode
  worst = {}
  for path in glob.glob(os.path.join(workdir, 'stall', 'rank_*.json')):
    with open(path) as f:
      learned = json.load(f)
    steps = learned['step_seconds']
    p99 = float(np.percentile(steps, 99))
    longest = max(learned['work_seconds'].get('step', 0.0),
                  learned['work_seconds'].get('compile', 0.0))
    worst[os.path.basename(path)] = {
        'p99_s': p99,
        'longest_interval_s': max(steps),
        'longest_seen_s': longest,
        'work_s': learned['work_seconds']
    }
  return {'exit_code': code, 'ranks': worst}


def bench_wedged(tmp: str, data_dir: str, args) -> dict:
  hang = _hang_to_exit(tmp)
  print(json.dumps({'hang': hang}), flush=True)
  quiet = []
  for i in range(args.quiet_runs):
    quiet.append(_quiet_run(tmp, data_dir, i))
    print(json.dumps({'quiet_run': i, **quiet[-1]}), flush=True)
  ratios = [
      r['longest_interval_s'] / r['p99_s']
      for q in quiet
      for r in q['ranks'].values()
  ]
  return {
      'hang':
          hang,
      'quiet_runs':
          len(quiet),
      'quiet_exit_codes': [q['exit_code'] for q in quiet],
      'longest_interval_over_p99':
          _spread(ratios),
      'longest_interval_s':
          max(r['longest_interval_s']
              for q in quiet
              for r in q['ranks'].values()),
      'longest_evaluation_s':
          max(r['work_s'].get('evaluation', 0.0)
              for q in quiet
              for r in q['ranks'].values()),
      'longest_compile_s':
          max(r['work_s'].get('compile', 0.0)
              for q in quiet
              for r in q['ranks'].values())
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--only', default=','.join(SECTIONS))
  parser.add_argument('--steps', type=int, default=1000)
  parser.add_argument('--kill_at', type=int, default=470)
  parser.add_argument('--every', type=int, default=200)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--quiet_runs', type=int, default=20)
  parser.add_argument('--cadences', default='10,25,50,100')
  parser.add_argument('--cost_steps', default='1000,300')
  parser.add_argument('--out', default='')
  args = parser.parse_args()
  benches = {
      'sigkill': bench_sigkill,
      'cluster': bench_cluster,
      'repeated': bench_repeated,
      'cost': bench_cost,
      'wedged': bench_wedged
  }
  report = {'args': vars(args)}
  with tempfile.TemporaryDirectory() as tmp:
    data_dir = os.path.join(tmp, 'mnist')
    mnist.write_synthetic(data_dir, num_train=20000, num_test=1000)
    for name in args.only.split(','):
      report[name] = benches[name](tmp, data_dir, args)
      print(json.dumps({name: report[name]}, indent=2), flush=True)
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(report, f, indent=2)


if __name__ == '__main__':
  main()
