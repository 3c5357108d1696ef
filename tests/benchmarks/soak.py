"""A randomized fault soak: how often a job recovers exactly, per kind of fault.

Each trial is a fresh census job (tests/workloads/census.py: parameters that
count every example and step trained) on a local pod, with one fault drawn
at random, at a random step, on a random process (process 0 included):

- sigkill_step: a process SIGKILLed while the job steps;
- sigkill_save: a process SIGKILLed while a persistent save is written
  (its temporary directory under checkpoints/ is there);
- sigkill_local_save: a process SIGKILLed while its own local-tier copy is
  written (its `.tmp_step_` directory is there);
- sigkill_start: after a first SIGKILL at a random step, a process of the
  next attempt SIGKILLed 0-3 s after that attempt starts (its start-up,
  restore or first compile): two losses in one recovery;
- sigkill_restore: the same, the second SIGKILL when the next attempt says
  it is restoring;
- sigkill_compile: the same, the second SIGKILL when the next attempt says
  it has restored (its first compile follows);
- damaged_local: a process SIGKILLed, then the newest copy in its local
  tier damaged before the next attempt reads it (state.npz truncated to
  half, or removed);
- sigstop: a process stopped (SIGSTOP) and left stopped: the others must
  name it lost and the job go on without it;
- preempt_one: SIGTERM to one process (a preemption notice): every process
  saves the agreed step and the job resumes there;
- preempt_pod: SIGTERM to the launcher (the pod's notice), then the same
  command again, as a scheduler would rerun it.

The state carries 8 MiB of ballast, so that a save and a restore last long
enough to be hit. Each block of as many trials as there are classes holds
every class once, in a random order, so that a run of N trials holds each
class N / classes times.

Each fault under a mode of the job:
- fixed: 2 processes x 4 devices, --max_restarts=3;
- elastic: 4 x 2, --min_processes=3, --regrow_after=3;
- sharded: the elastic pod with sharded state, each process a replica
  (--min_replicas=3): a lost process is a lost replica, which comes back
  restoring from its peers' local copies;
- calls: the fixed pod at 5 steps a call (config.steps_per_dispatch=5), so
  that a fault lands inside a call of several steps.

A trial succeeds when the job (after its rerun, for preempt_pod) ends 0,
its census equals what the data order says of every step once, every
attempt the launcher counted has a ledger, and nothing of the job is left:
no process, no file under the trial's local tier root, nothing in the
temporary directory its processes were given (TMPDIR). One JSON line per
trial goes to OUT/trials.jsonl; a table per class and mode to OUT/table.md
and the console, and the time to the first step per class to
OUT/first_step.png (with matplotlib).

  python tests/benchmarks/soak.py --trials=50 --seed=1 --out=/tmp/soak1
      [--classes=sigkill_step,sigstop] [--modes=fixed,elastic]
  python tests/benchmarks/soak.py --tables /tmp/soak1 /tmp/soak2 --out=/tmp/all
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

CLASSES = ('sigkill_step', 'sigkill_save', 'sigkill_local_save',
           'sigkill_start', 'sigkill_restore', 'sigkill_compile',
           'damaged_local', 'sigstop', 'preempt_one', 'preempt_pod')
# The classes whose second SIGKILL hits the next attempt.
_TWICE = ('sigkill_start', 'sigkill_restore', 'sigkill_compile')
MODES = ('fixed', 'elastic', 'sharded', 'calls')
STEPS, BATCH, EXAMPLES = 60, 48, 480
JOB = [
    f'--config={helpers.PROBE_CONFIG}', f'--config.steps={STEPS}',
    f'--config.global_batch_size={BATCH}',
    f'--config.data.num_examples={EXAMPLES}', '--config.census=True',
    '--config.log_every=1', '--config.step_seconds=0.05',
    '--config.checkpoint_every=20', '--config.local_checkpoint_every=5',
    '--config.ballast_floats=2097152'
]
POD = {
    'fixed': ['--local_processes=2', '--local_devices=4'],
    'elastic': [
        '--local_processes=4', '--local_devices=2', '--min_processes=3',
        '--regrow_after=3'
    ],
    'sharded': [
        '--local_processes=4', '--local_devices=2', '--min_replicas=3',
        '--regrow_after=3', '--config.state_layout=sharded'
    ],
    'calls': [
        '--local_processes=2', '--local_devices=4',
        '--config.steps_per_dispatch=5', '--config.log_every=5'
    ]
}
RESTARTS = [
    '--max_restarts=3', '--retry_exit_codes=137,10,124', '--restart_backoff=0.5'
]
# Each mode's marker and colour in the plot.
_MARKS = (('fixed', 'o', 'tab:blue'), ('elastic', 's', 'tab:orange'),
          ('sharded', '^', 'tab:green'), ('calls', 'D', 'tab:purple'))
_STEP = re.compile(r'\[rank (\d+)/\d+\].*metrics\.py:\d+\] step (\d+)/')
# The next attempt's start: a restart's, a shrink's or a growth's.
_STARTED = re.compile(r'\[launcher\] started \d+ ranks')


@dataclasses.dataclass
class Trial:
  """What one trial does: its fault, where and when."""
  index: int
  fault: str
  mode: str
  target: int  # the process the fault hits; -1: the launcher
  at_step: int
  start_delay_s: float = 0.0
  config: tuple[str, ...] = ()  # More --config flags, after JOB's.


def draw(rng: random.Random, count: int, classes, modes) -> list[Trial]:
  """`count` trials: every class once per block of len(classes), in a
  random order; the mode, target, step and delay drawn for each."""
  trials = []
  while len(trials) < count:
    block = list(classes)
    rng.shuffle(block)
    for fault in block[:count - len(trials)]:
      mode = rng.choice(modes)
      processes = 2 if mode in ('fixed', 'calls') else 4
      trials.append(
          Trial(len(trials), fault, mode,
                -1 if fault == 'preempt_pod' else rng.randrange(processes),
                rng.randint(5, STEPS - 15), round(rng.uniform(0.0, 3.0), 2)))
  return trials


class Watch:
  """The launcher's console, line by line with arrival times, and the
  events a fault waits for."""

  def __init__(self, proc: subprocess.Popen):
    self.lines: list[tuple[float, str]] = []
    self._changed = threading.Condition()
    self._threads = [
        threading.Thread(target=self._read, args=(pipe,), daemon=True)
        for pipe in (proc.stdout, proc.stderr)
    ]
    for thread in self._threads:
      thread.start()

  def _read(self, pipe) -> None:
    for line in pipe:
      with self._changed:
        self.lines.append((time.time(), line.rstrip('\n')))
        self._changed.notify_all()

  def wait_for(self,
               pattern: re.Pattern,
               after: float,
               timeout: float,
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


def _start(args: list[str], workdir: pathlib.Path, local_root: pathlib.Path,
           tmp: pathlib.Path) -> subprocess.Popen:
  env = helpers.launcher_env(PODRUN_LOCAL_CHECKPOINT_DIR=str(local_root),
                             TMPDIR=str(tmp))
  return subprocess.Popen(
      [sys.executable, '-m', 'launcher', *args, f'--workdir={workdir}'],
      cwd=REPO,
      env=env,
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True)


def _finish(proc: subprocess.Popen, watch: Watch, timeout: float) -> int:
  try:
    proc.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    helpers.kill_group(proc)
    proc.wait()
  watch.join()
  return proc.returncode


def _kill_when(there, workdir: pathlib.Path, target: int,
               timeout: float) -> bool:
  """SIGKILLs process `target` as soon as `there()` holds (polled every
  millisecond); at `timeout` without it, SIGKILLs it anyway. Returns
  whether `there()` still held just after the kill: the kill landed
  inside what it waited for."""
  deadline = time.time() + timeout
  while time.time() < deadline and not there():
    time.sleep(0.001)
  _signal_rank(workdir, target, signal.SIGKILL)
  return there()


def _damage_newest(local_root: pathlib.Path, target: int,
                   rng: random.Random) -> str:
  """Truncates to half, or removes, state.npz of the newest copy in process
  `target`'s local tier; says what it did."""
  copies = sorted(local_root.glob(f'*/rank_{target}/step_*/state.npz'),
                  key=lambda p: int(p.parent.name.split('_')[1]))
  if not copies:
    return 'no local copy to damage'
  newest = copies[-1]
  if rng.random() < 0.5:
    newest.unlink()
    return f'removed {newest.relative_to(local_root)}'
  with open(newest, 'r+b') as f:
    f.truncate(newest.stat().st_size // 2)
  return f'truncated {newest.relative_to(local_root)} to half'


def _inject(trial: Trial, proc, watch: Watch, workdir: pathlib.Path,
            local_root: pathlib.Path,
            started: float) -> tuple[Optional[float], str]:
  """Waits for the trial's step and does its fault; returns when, and
  where it landed."""
  at = watch.wait_for(_STEP, started, 240,
                      lambda m: int(m.group(2)) >= trial.at_step)
  if at is None:
    return None, 'never reached its step'
  fault_at = time.time()
  landed = 'step'
  fault = trial.fault
  if fault == 'preempt_pod':
    os.killpg(proc.pid, 0)  # Still there.
    proc.send_signal(signal.SIGTERM)
  elif fault == 'preempt_one':
    _signal_rank(workdir, trial.target, signal.SIGTERM)
  elif fault == 'sigstop':
    _signal_rank(workdir, trial.target, signal.SIGSTOP)
  elif fault == 'sigkill_save':
    saving = lambda: any(
        (workdir / 'checkpoints').glob('*.orbax-checkpoint-tmp*'))
    inside = _kill_when(saving, workdir, trial.target, 30)
    fault_at, landed = time.time(), ('persistent save'
                                     if inside else 'step (no save seen)')
  elif fault == 'sigkill_local_save':
    saving = lambda: any(local_root.glob(f'*/rank_{trial.target}/.tmp_step_*'))
    inside = _kill_when(saving, workdir, trial.target, 30)
    fault_at, landed = time.time(), ('local save'
                                     if inside else 'step (no save seen)')
  elif fault == 'damaged_local':
    _signal_rank(workdir, trial.target, signal.SIGKILL)
    landed = _damage_newest(local_root, trial.target,
                            random.Random(trial.index))
  else:
    _signal_rank(workdir, trial.target, signal.SIGKILL)
  if fault in _TWICE:
    landed = _kill_next_attempt(trial, watch, workdir, fault_at)
  return fault_at, landed


def _log_sizes(workdir: pathlib.Path) -> dict[str, int]:
  """The size of each process's log now: what follows is a later
  attempt's (the logs are appended to, attempt after attempt)."""
  return {
      p.name: p.stat().st_size for p in (workdir / 'logs').glob('rank_*.log')
  }


def _said_since(workdir: pathlib.Path, rank: int, sizes: dict[str, int]) -> str:
  """What process `rank`'s log says past `sizes`."""
  path = workdir / 'logs' / f'rank_{rank}.log'
  try:
    with open(path, errors='replace') as f:
      f.seek(sizes.get(path.name, 0))
      return f.read()
  except OSError:
    return ''


def _kill_next_attempt(trial: Trial, watch: Watch, workdir: pathlib.Path,
                       fault_at: float) -> str:
  """The second loss: a process of the attempt after `fault_at` SIGKILLed
  during its start (after the trial's delay), its restore or its first
  compile; says which phase its log had reached. (The console carries
  process 0's lines only, so the process's own log is read.)"""
  sizes = _log_sizes(workdir)
  restarted = watch.wait_for(_STARTED, fault_at, 120)
  if restarted is None:
    return 'no next attempt'
  processes = len(helpers.rank_pids(workdir))
  target = trial.target % processes
  if trial.fault == 'sigkill_start':
    time.sleep(trial.start_delay_s)
  else:
    needle = ('] restoring step'
              if trial.fault == 'sigkill_restore' else '] restored ')
    if not helpers.wait_for(
        lambda: needle in _said_since(workdir, target, sizes),
        120,
        interval=0.002):
      return f'process {target} of the next attempt never said {needle!r}'
  _signal_rank(workdir, target, signal.SIGKILL)
  said = _said_since(workdir, target, sizes)
  # Only process 0 logs steps; every process steps together.
  if re.search(r'\] step \d+/', _said_since(workdir, 0, sizes)):
    return 'step'
  if '] restored ' in said:
    return 'first compile'
  if '] restoring step' in said:
    return 'restore'
  return 'start-up'


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


def _files_under(root: pathlib.Path) -> list[str]:
  return sorted(
      str(p.relative_to(root)) for p in root.rglob('*') if not p.is_dir())


def run_trial(trial: Trial, root: pathlib.Path) -> dict:
  """Runs one trial in `root`; its JSON line."""
  workdir = root / f'trial-{trial.index:03d}'
  local_root = root / f'trial-{trial.index:03d}-local'
  tmp = root / f'trial-{trial.index:03d}-tmp'
  tmp.mkdir(parents=True)
  args = [*JOB, *trial.config, *POD[trial.mode], *RESTARTS]
  started = time.time()
  proc = _start(args, workdir, local_root, tmp)
  watch = Watch(proc)
  try:
    fault_at, landed = _inject(trial, proc, watch, workdir, local_root, started)
    code = _finish(proc, watch, 600)
    watch_lines = list(watch.lines)
    output = watch.text()
    if trial.fault == 'preempt_pod' and code == 75:
      # The scheduler reruns the command; the job resumes.
      proc = _start(args, workdir, local_root, tmp)
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
  files_left = ([f'local/{f}' for f in _files_under(local_root)] +
                [f'tmp/{f}' for f in _files_under(tmp)])
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
      (at - fault_at
       for at, line in sorted(watch_lines)
       if at >= fault_at and line.startswith('[launcher]')), None)
  success = (fault_at is not None and exact and not left and not unledgered and
             not files_left)
  return {
      **dataclasses.asdict(trial), 'success': success,
      'injected': fault_at is not None,
      'landed_in': landed,
      'exit_code': code,
      'census_exact': exact,
      'census': census_says,
      'attempts': len(attempts),
      'attempts_without_ledger': unledgered,
      'to_detection_s': None if said is None else round(said, 2),
      'to_first_step_s': None if first is None else round(first, 2),
      'recomputed_steps': recomputed,
      'left_behind': left,
      'files_left': files_left[:20],
      'wall_s': round(time.time() - started, 1),
      'last_lines': [] if success else output.splitlines()[-25:]
  }


def table(rows: list[dict]) -> str:
  """Per class: trials (in each mode of MODES), successes, where the faults
  landed, time to the first step after the fault (median, worst) and the
  worst steps recomputed."""
  groups = collections.defaultdict(list)
  for row in rows:
    groups[row['fault']].append(row)
  out = [
      f'| fault | trials ({", ".join(MODES)}) | recovered | landed in | '
      'first step after the fault, median (worst) s | worst steps '
      'recomputed |', '| --- | --- | --- | --- | --- | --- |'
  ]
  for fault in sorted(groups, key=lambda f: (CLASSES + (f,)).index(f)):
    group = groups[fault]
    times = [
        r['to_first_step_s'] for r in group if r['to_first_step_s'] is not None
    ]
    timing = (f'{statistics.median(times):.1f} ({max(times):.1f})'
              if times else '-')
    modes = collections.Counter(r['mode'] for r in group)
    landed = collections.Counter(
        re.sub(r' .*/.*', '', r.get('landed_in', 'step')) for r in group)
    out.append(
        f'| {fault} | {len(group)} ({", ".join(str(modes[m]) for m in MODES)}) | '
        f'{sum(r["success"] for r in group)} | '
        f'{", ".join(f"{k} {v}" for k, v in landed.most_common())} | '
        f'{timing} | {max(r["recomputed_steps"] for r in group)} |')
  total = sum(r['success'] for r in rows)
  out.append(f'\n{total} of {len(rows)} trials recovered exactly '
             f'({100 * total / max(1, len(rows)):.1f} %).')
  return '\n'.join(out)


def plot(rows: list[dict], path: pathlib.Path) -> bool:
  """Time to the first step after the fault, one dot per trial, a row per
  class, to `path` (PNG); False without matplotlib."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use('Agg')
    from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  faults = [f for f in CLASSES if any(r['fault'] == f for r in rows)]
  figure, axes = pyplot.subplots(figsize=(8, 0.45 * len(faults) + 1.2))
  for y, fault in enumerate(faults):
    for i, (mode, marker, color) in enumerate(_MARKS):
      times = [
          r['to_first_step_s'] for r in rows if r['fault'] == fault and
          r['mode'] == mode and r['to_first_step_s'] is not None
      ]
      offset = 0.12 * (i - (len(_MARKS) - 1) / 2)
      axes.scatter(times, [y + offset] * len(times),
                   marker=marker,
                   s=14,
                   alpha=0.6,
                   color=color,
                   label=mode if y == 0 else None)
  axes.set_yticks(range(len(faults)), faults)
  axes.invert_yaxis()
  axes.set_xlabel('seconds from the fault to the first step after it')
  axes.legend(loc='lower right')
  axes.grid(axis='x', alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  return True


def _write_results(rows: list[dict], out: pathlib.Path, heading: str) -> str:
  text = table(rows)
  (out / 'table.md').write_text(f'{heading}\n\n{text}\n')
  if plot(rows, out / 'first_step.png'):
    text += f'\n(plot: {out / "first_step.png"})'
  return text


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--trials', type=int, default=10)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out', default='')
  parser.add_argument('--classes', default=','.join(CLASSES))
  parser.add_argument('--modes', default=','.join(MODES))
  parser.add_argument('--tables',
                      nargs='*',
                      default=None,
                      help='runs\' --out directories: their trials in one '
                      'table and plot, nothing run')
  args = parser.parse_args(argv)
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
  out = pathlib.Path(args.out or tempfile.mkdtemp(prefix='soak-'))
  out.mkdir(parents=True, exist_ok=True)
  if args.tables is not None:
    rows = [
        json.loads(line)
        for run in args.tables
        for line in (pathlib.Path(run) / 'trials.jsonl').open()
    ]
    print(
        _write_results(rows, out, f'{len(rows)} trials of '
                       f'{", ".join(args.tables)}'))
    return 0
  trials = draw(random.Random(args.seed), args.trials, args.classes.split(','),
                args.modes.split(','))
  rows = []
  with tempfile.TemporaryDirectory(prefix='soak-jobs-') as jobs:
    for trial in trials:
      row = run_trial(trial, pathlib.Path(jobs))
      rows.append(row)
      with open(out / 'trials.jsonl', 'a') as f:
        f.write(json.dumps(row) + '\n')
      print(
          f'trial {trial.index}: {trial.fault} {trial.mode} process '
          f'{trial.target} at step {trial.at_step}, {row["landed_in"]}: '
          f'{"recovered" if row["success"] else "FAILED"} (exit '
          f'{row["exit_code"]}, {row["wall_s"]} s)',
          flush=True)
  print(_write_results(rows, out, f'seed {args.seed}, {args.trials} trials'))
  return 0 if all(r['success'] for r in rows) else 1


if __name__ == '__main__':
  sys.exit(main())
