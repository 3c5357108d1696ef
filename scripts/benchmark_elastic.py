"""What an elastic pod saves over one that waits for every host, side by side.

The probe linear regression on a local pod of 4 processes x 2 emulated CPU
devices, paced by --device_example_seconds for each example of a device's
share of the batch (a job on fewer devices takes longer steps, as devices
that compute do); rank 3 SIGKILLs itself at step
--kill_at and is "away" for --away seconds (--regrow_after). Alternating,
--rounds times each:

- elastic: --min_processes=3: the job goes on at once on 3 processes (the
  same global batch, accumulated), and grows back to 4 when rank 3 is back;
- waiting: --min_processes=4: the launcher waits until rank 3 is back, then
  starts the job again on 4, as a job that needs every host does.

Reports per run: the wall time, goodput and capacity-weighted goodput
(runtime/common/goodput.py), steps recomputed, and the costs
scripts/simulate_goodput.py takes: a shrink (the SIGKILL to the first
productive step on 3), a growth (the stop at a step boundary, from its
save to the first productive step on 4), a restart at full size (the
SIGKILL to the first productive step on 4, less the wait for capacity).

  python scripts/benchmark_elastic.py [--rounds=2] [--steps=600]
      [--kill_at=100] [--away=30] [--device_example_seconds=0.01]
      [--out=FILE.json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from launcher.common import goodput_rollup  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.common import layout  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.common import records  # pylint: disable=g-import-not-at-top,wrong-import-position

MODES = {'elastic': 3, 'waiting': 4}


def run_once(mode: str, args, workdir: str) -> dict:
  """One pod run; its figures."""
  command = [
      sys.executable, '-m', 'launcher',
      '--config=tests/workloads/probe_config.py', f'--workdir={workdir}',
      '--local_processes=4', '--local_devices=2',
      f'--min_processes={MODES[mode]}', f'--regrow_after={args.away}',
      f'--config.steps={args.steps}', '--config.global_batch_size=40',
      f'--config.device_example_seconds={args.device_example_seconds}',
      '--config.log_every=50', '--config.local_checkpoint_every=25',
      '--config.checkpoint_every=1000', '--config.fail_rank=3',
      f'--config.fail_step={args.kill_at}', '--config.fail_mode=sigkill',
      '--config.fail_once=True'
  ]
  started = time.time()
  # A step on 3 of 4 processes: at most 10 examples a device.
  timeout = args.steps * args.device_example_seconds * 10 * 4 + 600
  result = subprocess.run(command,
                          cwd=REPO,
                          capture_output=True,
                          text=True,
                          timeout=timeout,
                          check=False)
  if result.returncode:
    raise SystemExit(
        f'{mode}: exit {result.returncode}\n{result.stderr[-3000:]}')
  roll = goodput_rollup.rollup(layout.Record(workdir))
  launches = records.read_attempts(
      os.path.join(workdir, 'logs', layout.ATTEMPTS))
  return {
      'mode':
          mode,
      'wall_s':
          time.time() - started,
      'goodput':
          roll['goodput'],
      'capacity_goodput':
          roll['capacity_goodput'],
      'reduced_size_s':
          roll['reduced_size_s'],
      'recomputed_steps':
          sum((a['notes'].get('recomputed_steps') or 0)
              for a in roll['attempts']),
      **costs(roll['attempts'], launches, args.away)
  }


def _first_productive(attempt: dict) -> float:
  return (attempt['notes'].get('first_productive') or {}).get('wall', 0.0)


def costs(attempts: list[dict], launches, away_s: float) -> dict:
  """The shrink, growth and restart costs (s) of one run's attempts."""
  out = {}
  for before, after, launch in zip(attempts, attempts[1:], launches):
    if launch.resize == 'shrink':
      out['shrink_s'] = _first_productive(after) - launch.fault.at
    elif launch.resize == 'grow':
      out['grow_s'] = (_first_productive(after) - before['ended'] +
                       before['parts'].get('preemption_save', 0.0))
    elif launch.resize == 'wait':
      out['restart_s'] = (_first_productive(after) - launch.fault.at - away_s)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--steps', type=int, default=600)
  parser.add_argument('--kill_at', type=int, default=100)
  parser.add_argument('--away', type=float, default=30.0)
  # 5 examples per device at full size (40 on 8 devices): 0.05 s steps,
  # 0.1 s on half the devices.
  parser.add_argument('--device_example_seconds', type=float, default=0.01)
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  runs = []
  for round_ in range(args.rounds):
    for mode in MODES:
      with tempfile.TemporaryDirectory(prefix=f'elastic-{mode}-') as workdir:
        runs.append({'round': round_, **run_once(mode, args, workdir)})
      print(json.dumps(runs[-1]), flush=True)
  for mode in MODES:
    mine = [r for r in runs if r['mode'] == mode]
    mean = {
        k: sum(r.get(k, 0.0) for r in mine) / len(mine)
        for k in ('wall_s', 'goodput', 'capacity_goodput')
    }
    print(f'{mode}: wall {mean["wall_s"]:.1f} s, goodput '
          f'{mean["goodput"]:.3f}, capacity-weighted '
          f'{mean["capacity_goodput"]:.3f} (mean of {len(mine)})')
  if args.out:
    with open(args.out, 'w') as f:
      json.dump({'args': vars(args), 'runs': runs}, f, indent=2)
  return 0


if __name__ == '__main__':
  sys.exit(main())
