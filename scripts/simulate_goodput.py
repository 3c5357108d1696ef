"""Expected goodput of a spot fleet larger than this machine: wait or shrink.

An N-slice job on spot capacity, each slice preempted at --preemptions_per_day
(a Poisson process while it is up) and back after a capacity wait (an
exponential of mean --capacity_wait_s) plus --recreate_s (delete, create,
set-up). Two policies, simulated event by event over --days, --trials times:

- wait: the job runs only on all N slices; a lost slice stops it until the
  slice is back, then it restarts (--restart_s);
- elastic: the job runs on K = ceil(N x --min_fraction) or more slices; a
  lost slice costs a shrink (--shrink_s), a slice back a growth (--grow_s,
  a stop at a step boundary: nothing recomputed); below K it waits.

A loss without the preemption notice reaching the job (--hard_fraction of
them) also loses half a local checkpoint interval of training
(--local_every_s / 2). The job at m of N slices trains at m / N of its
full speed (the same global batch, accumulated): goodput counts the time
it trains, capacity-weighted goodput the full-speed work it does
(runtime/common/goodput.py defines both the same way).

The restart, shrink and growth defaults are this project's figures
(BUILD_NOTES.md, "Elastic data parallelism": scripts/benchmark_elastic.py
on a local pod, tests/benchmarks/benchmark_tpu_elastic.py on the emulated
Cloud TPU). The preemption rates, the capacity waits and --recreate_s (the
emulated delete, create and set-up take 4 to 6 s here; Cloud TPU's take
minutes) are assumptions to vary: Cloud TPU publishes no spot preemption
rate.

  python scripts/simulate_goodput.py [--slices=4,16,64]
      [--preemptions_per_day=0.05,1,4] [--capacity_wait_s=1800]
      [--min_fraction=0.5] [--days=30] [--trials=20]
"""

import argparse
import dataclasses
import heapq
import math
import sys

import numpy as np


@dataclasses.dataclass(frozen=True)
class Costs:
  """Seconds each event costs the job."""
  restart_s: float
  shrink_s: float
  grow_s: float
  recreate_s: float
  lost_work_s: float  # Training lost by a hard loss.
  hard_fraction: float


@dataclasses.dataclass
class Job:
  """The job's state in one simulation."""
  n: int
  minimum: int
  up: int
  running: bool = True
  busy_until: float = 0.0  # Down (restarting, shrinking, growing) until.
  trained_s: float = 0.0
  work_s: float = 0.0  # Full-speed seconds of training.

  def advance(self, start: float, end: float) -> None:
    """Accounts for [start, end) at the current size."""
    if not self.running:
      return
    seconds = max(0.0, end - max(start, self.busy_until))
    self.trained_s += seconds
    self.work_s += seconds * self.up / self.n

  def pause(self, now: float, seconds: float) -> None:
    self.busy_until = max(self.busy_until, now) + seconds


def _on_loss(job: Job, now: float, costs: Costs, rng) -> None:
  if job.running and rng.random() < costs.hard_fraction:
    job.trained_s -= costs.lost_work_s
    job.work_s -= costs.lost_work_s * job.up / job.n
  job.up -= 1
  if job.up >= job.minimum and job.running:
    job.pause(now, costs.shrink_s)
  else:
    job.running = False


def _on_return(job: Job, now: float, costs: Costs) -> None:
  job.up += 1
  if job.running:
    job.pause(now, costs.grow_s)
  elif job.up >= job.minimum:
    job.running = True
    job.busy_until = now + costs.restart_s


def simulate(n: int, minimum: int, rate_per_s: float, wait_mean_s: float,
             horizon_s: float, costs: Costs, rng) -> tuple[float, float]:
  """(goodput, capacity-weighted goodput) of one run of `horizon_s`."""
  job = Job(n, minimum, n)
  events = [(rng.exponential(1 / rate_per_s), 'loss', s) for s in range(n)]
  heapq.heapify(events)
  now = 0.0
  while events and events[0][0] < horizon_s:
    when, kind, slice_ = heapq.heappop(events)
    job.advance(now, when)
    now = when
    if kind == 'loss':
      _on_loss(job, now, costs, rng)
      back = now + rng.exponential(wait_mean_s) + costs.recreate_s
      heapq.heappush(events, (back, 'return', slice_))
    else:
      _on_return(job, now, costs)
      heapq.heappush(events,
                     (now + rng.exponential(1 / rate_per_s), 'loss', slice_))
  job.advance(now, horizon_s)
  return job.trained_s / horizon_s, job.work_s / horizon_s


def table(args, costs: Costs) -> list[str]:
  """One row per (slices, preemption rate): both policies' means."""
  rng = np.random.default_rng(args.seed)
  lines = [
      '| slices | preemptions / slice / day | wait: goodput | wait: '
      'capacity-weighted | elastic (K): goodput | elastic: '
      'capacity-weighted |', '| --- | --- | --- | --- | --- | --- |'
  ]
  horizon = args.days * 86400
  for n in args.slices:
    k = max(1, math.ceil(n * args.min_fraction))
    for rate in args.preemptions_per_day:
      results = {}
      for name, minimum in (('wait', n), ('elastic', k)):
        runs = [
            simulate(n, minimum, rate / 86400, args.capacity_wait_s, horizon,
                     costs, rng) for _ in range(args.trials)
        ]
        results[name] = np.mean(runs, axis=0)
      lines.append(
          f'| {n} | {rate:g} | {results["wait"][0]:.3f} | '
          f'{results["wait"][1]:.3f} | {results["elastic"][0]:.3f} ({k}) | '
          f'{results["elastic"][1]:.3f} |')
  return lines


def _floats(text: str) -> list[float]:
  return [float(x) for x in text.split(',') if x.strip()]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument('--slices', default='4,16,64')
  parser.add_argument('--preemptions_per_day', default='0.05,1,4')
  parser.add_argument('--capacity_wait_s', type=float, default=1800)
  parser.add_argument('--min_fraction', type=float, default=0.5)
  parser.add_argument('--days', type=float, default=30)
  parser.add_argument('--trials', type=int, default=20)
  parser.add_argument('--seed', type=int, default=0)
  # Measured here (BUILD_NOTES.md, "Elastic jobs"); `_ASSUMED` says which
  # of the others are guesses.
  parser.add_argument('--restart_s', type=float, default=15.0)
  parser.add_argument('--shrink_s', type=float, default=14.0)
  parser.add_argument('--grow_s', type=float, default=7.3)
  parser.add_argument('--recreate_s', type=float, default=300)
  parser.add_argument('--local_every_s', type=float, default=60)
  parser.add_argument('--hard_fraction', type=float, default=0.5)
  args = parser.parse_args(argv)
  args.slices = [int(x) for x in _floats(args.slices)]
  args.preemptions_per_day = _floats(args.preemptions_per_day)
  costs = Costs(args.restart_s, args.shrink_s, args.grow_s, args.recreate_s,
                args.local_every_s / 2, args.hard_fraction)
  print('\n'.join(describe_inputs(args)))
  print(f'{args.days:g} days x {args.trials} trials')
  print('\n'.join(table(args, costs)))
  return 0


# Which inputs this project measured, and where; the rest are assumptions.
_MEASURED = {
    'restart_s': 'measured: a local pod\'s restart (BUILD_NOTES.md, '
                 '"Elastic data parallelism", scripts/benchmark_elastic.py)',
    'shrink_s': 'measured: the same, a shrink',
    'grow_s': 'measured: the same, a growth',
}
_ASSUMED = {
    'recreate_s': 'assumed: Cloud TPU\'s delete, create and set-up (the '
                  'emulated one takes 4 to 6 s here)',
    'local_every_s': 'assumed: the local tier\'s cadence in seconds',
    'hard_fraction': 'assumed: the losses whose notice does not reach the '
                     'job',
    'preemptions_per_day': 'assumed: Cloud TPU publishes no spot rate',
    'capacity_wait_s': 'assumed: the mean wait for capacity',
    'min_fraction': 'chosen: the elastic job\'s fewest slices, a share',
}


def describe_inputs(args) -> list[str]:
  """One line per input: its value, and whether it was measured here or
  is an assumption."""
  lines = []
  for name, why in {**_MEASURED, **_ASSUMED}.items():
    value = getattr(args, name)
    shown = (','.join(
        f'{v:g}' for v in value) if isinstance(value, list) else f'{value:g}')
    lines.append(f'--{name}={shown}: {why}')
  return lines


if __name__ == '__main__':
  sys.exit(main())
