"""What one SIGKILL costs: `benchmark_chip.py --mode=fault`.

For each of `kills` rounds, in a fresh workdir: the launcher runs the decoder
LM (`python -m launcher --config=configs/decoder.py:SHAPE`, checkpoints at
their defaults) until its high-water step (goodput.HighWater) reaches a step
drawn from [low, high] with `seed`; its process group is SIGKILLed; the same
command starts again at once and runs until its first step after the
restore, and a few seconds more for its ledger to be written; then it is
killed too. Per round:

- restart_s: from the second command's start to its first step;
- its phases, from the second attempt's ledger (the parts and the named
  pieces of 'other', and what is left unnamed), up to that first step;
- the steps recomputed (the kill's step less the restored one) and their
  seconds at the first attempt's pace;
- lost_s: restart_s plus the recomputed seconds.

One process and no sockets: it runs where the chip allows nothing else.

Example:
  >>> rounds = run('gpt2_small', '/tmp/scratch', kills=3, seed=0)
"""

import glob
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_POLL_S = 0.02
# The ledger is rewritten every 2 s: wait that long after the first step.
_LEDGER_WAIT_S = 3.0


def _high_water(workdir: str) -> dict[str, int]:
  """{attempt: the last step its process 0 completed}."""
  from runtime.common import goodput  # pylint: disable=g-import-not-at-top
  return {
      os.path.basename(os.path.dirname(path)): goodput.HighWater.read(path) for
      path in glob.glob(os.path.join(workdir, 'goodput', '*', 'rank_0.step'))
  }


def _start(argv: list[str], env: dict, log: str) -> subprocess.Popen:
  with open(log, 'ab') as out:
    return subprocess.Popen(argv,
                            cwd=REPO,
                            env=env,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True)


def _kill(process: subprocess.Popen) -> None:
  try:
    os.killpg(process.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  process.wait()


def _wait_for(condition, process: subprocess.Popen, timeout_s: float, what: str,
              log: str):
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    found = condition()
    if found:
      return found
    if process.poll() is not None:
      raise RuntimeError(f'the launcher exited {process.returncode} before '
                         f'{what}; its log: {log}')
    time.sleep(_POLL_S)
  _kill(process)
  raise RuntimeError(f'no {what} within {timeout_s} s; log: {log}')


def _ledger(workdir: str, attempt: str) -> dict[str, Any]:
  with open(os.path.join(workdir, 'goodput', attempt, 'rank_0.json')) as f:
    return json.load(f)


def _phases(ledger: dict[str, Any]) -> dict[str, float]:
  """The seconds from the process's start to its first step (the ledger's
  `first_step` note), by part and named piece of 'other'; 'unnamed' is
  the rest of 'other' then."""
  first = ledger['notes']['first_step']
  parts = dict(first['parts'])
  named = dict(first.get('other_named') or {})
  phases = {k: v for k, v in parts.items() if v and k != 'other'}
  phases.update({k: v for k, v in named.items() if v})
  phases['unnamed'] = parts.get('other', 0.0) - sum(named.values())
  phases['to_first_step'] = first['wall'] - ledger['started']
  return phases


def one_round(argv: list[str], env: dict, workdir: str, kill_at: int,
              log: str) -> dict[str, Any]:
  """Runs, kills at `kill_at`, restarts; the round's figures."""
  first = _start(argv, env, log)
  started = time.monotonic()
  _wait_for(lambda: max(_high_water(workdir).values(), default=0) >= kill_at,
            first, 900, f'step {kill_at}', log)
  killed_step = max(_high_water(workdir).values())
  run_s = time.monotonic() - started
  _kill(first)
  (before,) = _high_water(workdir)
  restart = _start(argv, env, log)
  restarted = time.monotonic()

  def first_step():
    new = {a: s for a, s in _high_water(workdir).items() if a != before}
    return next((a for a, s in new.items() if s > 0), None)

  attempt = _wait_for(first_step, restart, 600, 'a step after the restart', log)
  restart_s = time.monotonic() - restarted
  time.sleep(_LEDGER_WAIT_S)
  _kill(restart)
  earlier, later = _ledger(workdir, before), _ledger(workdir, attempt)
  restored = later['notes'].get('restore_step') or 0
  productive = earlier['parts']['productive']
  step_s = productive / max(killed_step, 1)
  recomputed = killed_step - restored
  return {
      'kill_step': killed_step,
      'restore_step': restored,
      'restore_tier': later['notes'].get('restore_tier'),
      'recomputed_steps': recomputed,
      'step_s': step_s,
      'recomputed_s': recomputed * step_s,
      'restart_s': restart_s,
      'lost_s': restart_s + recomputed * step_s,
      'phases': _phases(later),
      'first_attempt_s': run_s,
      'local_interval': earlier['notes'].get('local_interval')
  }


def run(shape: str,
        scratch: str,
        kills: int = 3,
        seed: int = 0,
        low: int = 200,
        high: int = 1000,
        steps: int = 1200,
        extra: tuple[str, ...] = ()) -> dict[str, Any]:
  """`kills` rounds; each round's figures and the medians."""
  env = _env()
  draw = random.Random(seed)
  rounds = []
  for i in range(kills):
    workdir = os.path.join(scratch, f'fault_{i}')
    # One compilation cache for every round: a restart finds its job's
    # programs there, and only the first round's first attempt compiles.
    argv = [
        sys.executable, '-m', 'launcher',
        f'--config=configs/decoder.py:{shape}', f'--config.steps={steps}',
        f'--workdir={workdir}',
        f'--compilation_cache_dir={scratch}/compilation_cache', *extra
    ]
    rounds.append(
        one_round(argv, env, workdir, draw.randint(low, high),
                  os.path.join(scratch, f'fault_{i}.log')))
  if not rounds:
    return {'rounds': [], 'seed': seed}
  return {
      'rounds':
          rounds,
      'seed':
          seed,
      'median_lost_s':
          statistics.median(r['lost_s'] for r in rounds),
      'median_restart_s':
          statistics.median(r['restart_s'] for r in rounds),
      'median_recomputed_s':
          statistics.median(r['recomputed_s'] for r in rounds)
  }


def describe(result: dict[str, Any]) -> str:
  """The rounds as lines: kill, restore, lost, and the restart's phases."""
  lines = []
  for r in result['rounds']:
    phases = ', '.join(
        f'{k} {v:.2f}'
        for k, v in sorted(r['phases'].items(), key=lambda kv: -kv[1]))
    lines.append(
        f'killed at step {r["kill_step"]}, restored {r["restore_step"]} '
        f'({r["restore_tier"]}): restart {r["restart_s"]:.1f} s + '
        f'{r["recomputed_steps"]} steps recomputed ({r["recomputed_s"]:.1f} '
        f's) = {r["lost_s"]:.1f} s lost; phases: {phases}')
  if result['rounds']:
    lines.append(f'median lost {result["median_lost_s"]:.1f} s (restart '
                 f'{result["median_restart_s"]:.1f} s, recomputed '
                 f'{result["median_recomputed_s"]:.1f} s)')
  clean = result.get('clean')
  if clean:
    lines.append(
        f'loop with checkpoints at their defaults / without: '
        f'{clean["loop_defaults_vs_none"]:.3f}; the run with the defaults '
        f'left {clean["defaults"]["unnamed_s"]:.2f} s of other '
        'unnamed')
  return '\n'.join(lines)


def clean_runs(shape: str, scratch: str, steps: int = 300) -> dict[str, Any]:
  """The same job run to its end with checkpoints at their defaults and
  with none, one after the other: each loop's median steps/s over its
  step lines past the first 50 steps (the local copies' blocking in the
  defaults' lines), their ratio, and where the defaults' run's 'other'
  went (its named pieces and what is left unnamed)."""
  env = _env()
  out = {}
  for name, extra in (('defaults', ()), ('none',
                                         ('--config.checkpointing=False',))):
    workdir = os.path.join(scratch, f'clean_{name}')
    argv = [
        sys.executable, '-m', 'launcher',
        f'--config=configs/decoder.py:{shape}', f'--config.steps={steps}',
        f'--workdir={workdir}',
        f'--compilation_cache_dir={scratch}/compilation_cache', *extra
    ]
    with open(os.path.join(scratch, f'clean_{name}.log'), 'wb') as log:
      started = time.monotonic()
      subprocess.run(argv,
                     cwd=REPO,
                     env=env,
                     stdout=log,
                     stderr=subprocess.STDOUT,
                     check=True,
                     timeout=900)
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      rates = [
          row['steps_per_sec']
          for row in map(json.loads, f)
          if 'steps_per_sec' in row and 50 < row['step'] < steps
      ]
    (attempt,) = _high_water(workdir)
    ledger = _ledger(workdir, attempt)
    named = ledger['other_named']
    out[name] = {
        'wall_s': time.monotonic() - started,
        'loop_steps_per_sec': statistics.median(rates),
        'parts': ledger['parts'],
        'other_named': named,
        'unnamed_s': ledger['parts']['other'] - sum(named.values())
    }
  out['loop_defaults_vs_none'] = (out['defaults']['loop_steps_per_sec'] /
                                  out['none']['loop_steps_per_sec'])
  return out


def _env() -> dict:
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')
  }
  env['PYTHONPATH'] = os.pathsep.join(
      [REPO] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
  return env
