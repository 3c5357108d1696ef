"""A randomized fault soak: how often a job recovers exactly, per kind of fault.

Each trial is a fresh census job (tests/workloads/census.py: parameters that
count every example and step trained) on a local pod, with one fault drawn
at random, at a random step, on a random process (process 0 included):

- sigkill_step: a process SIGKILLed while the job steps;
- sigkill_start: a process of the next attempt SIGKILLed 0-3 s after that
  attempt starts (its start-up, restore or first compile), after a first
  SIGKILL at a random step: two losses in one recovery;
- sigstop: a process stopped (SIGSTOP) and left stopped: the others must
  name it lost and the job go on without it;
- preempt_one: SIGTERM to one process (a preemption notice): every process
  saves the agreed step and the job resumes there;
- preempt_pod: SIGTERM to the launcher (the pod's notice), then the same
  command again, as a scheduler would rerun it.

Each fault under a fixed-size job (2 processes x 4 devices, --max_restarts=3)
or an elastic one (4 x 2, --min_processes=3, --regrow_after=3).

A trial succeeds when the job (after its rerun, for preempt_pod) ends 0,
its census equals what the data order says of every step once, every
attempt the launcher counted has a ledger, and no process of the job is
left. One JSON line per trial goes to OUT/trials.jsonl; a table per class
and mode to OUT/table.md and the console.

  python tests/benchmarks/soak.py --trials=50 --seed=1 --out=/tmp/soak1
      [--classes=sigkill_step,sigstop] [--modes=fixed,elastic]
"""

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests import helpers  # pylint: disable=g-import-not-at-top,wrong-import-position

CLASSES = ('sigkill_step', 'sigkill_start', 'sigstop', 'preempt_one',
           'preempt_pod')
MODES = ('fixed', 'elastic')
STEPS, BATCH, EXAMPLES = 60, 48, 480
JOB = [f'--config={helpers.PROBE_CONFIG}', f'--config.steps={STEPS}',
       f'--config.global_batch_size={BATCH}',
       f'--config.data.num_examples={EXAMPLES}', '--config.census=True',
       '--config.log_every=1', '--config.step_seconds=0.05',
       '--config.checkpoint_every=20', '--config.local_checkpoint_every=5']
POD = {'fixed': ['--local_processes=2', '--local_devices=4'],
       'elastic': ['--local_processes=4', '--local_devices=2',
                   '--min_processes=3', '--regrow_after=3']}
RESTARTS = ['--max_restarts=3', '--retry_exit_codes=137,10,124',
            '--restart_backoff=0.5']
_STEP = re.compile(r'\[rank (\d+)/\d+\].*metrics\.py:\d+\] step (\d+)/')
# The next attempt's start: a restart's, a shrink's or a growth's.
_STARTED = re.compile(r'\[launcher\] started \d+ ranks')


@dataclasses.dataclass
class Trial:
  """What one trial does: its fault, where and when."""
  index: int
  fault: str
  mode: str
  target: int   # the process the fault hits; -1: the launcher
  at_step: int
  start_delay_s: float = 0.0


def draw(rng: random.Random, index: int, classes, modes) -> Trial:
  fault, mode = rng.choice(classes), rng.choice(modes)
  processes = 2 if mode == 'fixed' else 4
  return Trial(index, fault, mode,
               -1 if fault == 'preempt_pod' else rng.randrange(processes),
               rng.randint(5, STEPS - 15), round(rng.uniform(0.0, 3.0), 2))


class Watch:
  """The launcher's console, line by line with arrival times, and the
  events a fault waits for."""

  def __init__(self, proc: subprocess.Popen):
    self.lines: list[tuple[float, str]] = []
    self._changed = threading.Condition()
    self._threads = [threading.Thread(target=self._read, args=(pipe,),
                                      daemon=True)
                     for pipe in (proc.stdout, proc.stderr)]
    for thread in self._threads:
      thread.start()

  def _read(self, pipe) -> None:
    for line in pipe:
      with self._changed:
        self.lines.append((time.time(), line.rstrip('\n')))
        self._changed.notify_all()

  def wait_for(self, pattern: re.Pattern, after: float, timeout: float,
               test=lambda m: True) -> Optional[float]:
    """When the first line after `after` matching `pattern` (and `test`
    of its match) arrived; None after `timeout`."""
    deadline = time.time() + timeout
    with self._changed:
      while True:
        for at, line in self.lines:
          found = pattern.search(line)
          if at >= after and found and test(found):
            return at
        if time.time() >= deadline:
          return None
        self._changed.wait(deadline - time.time())

  def join(self) -> None:
    for thread in self._threads:
      thread.join(timeout=10)

  def text(self) -> str:
    return '\n'.join(l for _, l in sorted(self.lines))


def _signal_rank(workdir: pathlib.Path, rank: int, signum: int) -> bool:
  """Sends `signum` to process `rank` of the current attempt."""
  try:
    pid = helpers.rank_pids(workdir)[rank]
    os.kill(pid, signum)
    return True
  except (OSError, KeyError, ValueError):
    return False


def _start(args: list[str], workdir: pathlib.Path) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, '-m', 'launcher', *args, f'--workdir={workdir}'],
      cwd=REPO, env=helpers.launcher_env(), stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)


def _finish(proc: subprocess.Popen, watch: Watch, timeout: float) -> int:
  try:
    proc.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    helpers.kill_group(proc)
    proc.wait()
  watch.join()
  return proc.returncode


def _inject(trial: Trial, proc, watch: Watch, workdir: pathlib.Path,
            started: float) -> Optional[float]:
  """Waits for the trial's step and does its fault; returns when."""
  at = watch.wait_for(_STEP, started, 240,
                      lambda m: int(m.group(2)) >= trial.at_step)
  if at is None:
    return None
  fault_at = time.time()
  if trial.fault == 'preempt_pod':
    os.killpg(proc.pid, 0)  # Still there.
    proc.send_signal(signal.SIGTERM)
  elif trial.fault == 'preempt_one':
    _signal_rank(workdir, trial.target, signal.SIGTERM)
  elif trial.fault == 'sigstop':
    _signal_rank(workdir, trial.target, signal.SIGSTOP)
  else:
    _signal_rank(workdir, trial.target, signal.SIGKILL)
  if trial.fault == 'sigkill_start':
    # The next attempt: kill one of its processes during its start.
    restarted = watch.wait_for(_STARTED, fault_at, 120)
    if restarted is not None:
      time.sleep(trial.start_delay_s)
      processes = len(helpers.rank_pids(workdir))
      _signal_rank(workdir, trial.target % processes, signal.SIGKILL)
  return fault_at


def _census_exact(workdir: pathlib.Path) -> Optional[str]:
  """None when the final parameters count every step once and each
  example as often as the data order says; else what differs."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tests.workloads import census  # pylint: disable=g-import-not-at-top
  try:
    trained = census.counts(helpers.final_state(workdir)['params'])
  except (AssertionError, OSError, ValueError) as e:
    return f'no census: {str(e)[:200]}'
  if trained.steps != STEPS:
    return f'{trained.steps} steps counted, {STEPS} trained'
  wanted = census.expected(BATCH, EXAMPLES, 0, STEPS)
  if not np.array_equal(trained.examples, wanted):
    wrong = np.flatnonzero(trained.examples != wanted)
    return (f'{len(wrong)} examples counted wrong, e.g. example '
            f'{wrong[0]}: {trained.examples[wrong[0]]} for {wanted[wrong[0]]}')
  return None


def _first_step_after(workdir: pathlib.Path, when: float) -> Optional[float]:
  """The first step of an attempt that started after `when`, from the
  ledgers; seconds after `when`."""
  firsts = []
  for path in workdir.glob('goodput/*/rank_0.json'):
    ledger = helpers.read_json(path)
    first = ledger['notes'].get('first_step_wall')
    if first is not None and ledger['started'] >= when:
      firsts.append(first - when)
  return min(firsts, default=None)


def run_trial(trial: Trial, root: pathlib.Path) -> dict:
  workdir = root / f'trial-{trial.index:03d}'
  args = [*JOB, *POD[trial.mode], *RESTARTS]
  started = time.time()
  proc = _start(args, workdir)
  watch = Watch(proc)
  try:
    fault_at = _inject(trial, proc, watch, workdir, started)
    code = _finish(proc, watch, 600)
    watch_lines = list(watch.lines)
    output = watch.text()
    if trial.fault == 'preempt_pod' and code == 75:
      # The scheduler reruns the command; the job resumes.
      proc = _start(args, workdir)
      watch = Watch(proc)
      code = _finish(proc, watch, 600)
      output += '\n' + watch.text()
  finally:
    helpers.kill_group(proc)
  # Anything of the job still alive after the kernel had a moment: left.
  left = []
  if (workdir / 'logs' / 'job.json').exists():
    helpers.wait_for(lambda: not helpers.job_processes(workdir), 10)
    left = helpers.job_processes(workdir)
  census_says = _census_exact(workdir) if code == 0 else 'not run to its end'
  exact = census_says is None
  attempts = helpers.read_jsonl(workdir / 'logs' / 'attempts.jsonl') if (
      workdir / 'logs' / 'attempts.jsonl').exists() else []
  ledgers = {p.parent.name for p in workdir.glob('goodput/*/rank_0.json')}
  unledgered = [a.get('name') for a in attempts if a.get('name') not in ledgers]
  recomputed = sum(
      helpers.read_json(p)['notes'].get('recomputed_steps') or 0
      for p in workdir.glob('goodput/*/rank_0.json'))
  first = None if fault_at is None else _first_step_after(workdir, fault_at)
  # Detection: the launcher's first word after the fault (a failure named,
  # a process lost, a preemption's save).
  said = None if fault_at is None else next(
      (at - fault_at for at, line in sorted(watch_lines)
       if at >= fault_at and line.startswith('[launcher]')), None)
  success = (fault_at is not None and exact and not left and not unledgered)
  return {**dataclasses.asdict(trial), 'success': success,
          'injected': fault_at is not None, 'exit_code': code,
          'census_exact': exact, 'census': census_says,
          'attempts': len(attempts),
          'attempts_without_ledger': unledgered,
          'to_detection_s': None if said is None else round(said, 2),
          'to_first_step_s': None if first is None else round(first, 2),
          'recomputed_steps': recomputed, 'left_behind': left,
          'wall_s': round(time.time() - started, 1),
          'last_lines': [] if success else output.splitlines()[-25:]}


def table(rows: list[dict]) -> str:
  """Per class and mode: trials, successes, time to the first step after
  the fault (median, worst) and the worst steps recomputed."""
  groups = collections.defaultdict(list)
  for row in rows:
    groups[(row['fault'], row['mode'])].append(row)
  out = ['| fault | mode | trials | recovered | first step after the fault, '
         'median (worst) s | worst steps recomputed |',
         '| --- | --- | --- | --- | --- | --- |']
  for (fault, mode), group in sorted(groups.items()):
    times = [r['to_first_step_s'] for r in group
             if r['to_first_step_s'] is not None]
    timing = (f'{statistics.median(times):.1f} ({max(times):.1f})'
              if times else '-')
    out.append(f'| {fault} | {mode} | {len(group)} | '
               f'{sum(r["success"] for r in group)} | {timing} | '
               f'{max(r["recomputed_steps"] for r in group)} |')
  total = sum(r['success'] for r in rows)
  out.append(f'\n{total} of {len(rows)} trials recovered exactly.')
  return '\n'.join(out)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--trials', type=int, default=10)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out', default='')
  parser.add_argument('--classes', default=','.join(CLASSES))
  parser.add_argument('--modes', default=','.join(MODES))
  args = parser.parse_args(argv)
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
  out = pathlib.Path(args.out or tempfile.mkdtemp(prefix='soak-'))
  out.mkdir(parents=True, exist_ok=True)
  rng = random.Random(args.seed)
  rows = []
  with tempfile.TemporaryDirectory(prefix='soak-jobs-') as jobs:
    for index in range(args.trials):
      trial = draw(rng, index, args.classes.split(','),
                   args.modes.split(','))
      row = run_trial(trial, pathlib.Path(jobs))
      rows.append(row)
      with open(out / 'trials.jsonl', 'a') as f:
        f.write(json.dumps(row) + '\n')
      print(f'trial {index}: {trial.fault} {trial.mode} process '
            f'{trial.target} at step {trial.at_step}: '
            f'{"recovered" if row["success"] else "FAILED"} (exit '
            f'{row["exit_code"]}, {row["wall_s"]} s)', flush=True)
  text = table(rows)
  (out / 'table.md').write_text(
      f'seed {args.seed}, {args.trials} trials\n\n{text}\n')
  print(text)
  return 0 if all(r['success'] for r in rows) else 1


if __name__ == '__main__':
  sys.exit(main())
