"""How soon a hang in the first steps ends the job, with default flags.

  python tests/benchmarks/benchmark_early_hang.py [--steps=2,10,20] [--rounds=1]

Two processes started by hand, as on a cluster (tests/cluster.py), train
the linear-regression probe; rank 1's input hangs while it loads the batch
of step N. Prints, per N, the seconds from the hang to each process's exit
(124 expected) and the deadline the watchdog said it used. Before 20 steps
the warm-up deadline applies (launcher/process/stall.py), after it the learned
one; --stall_timeout (600 s) is only the ceiling.
"""

import argparse
import json
import os
import pathlib
import re
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
sys.path.insert(0, REPO)
from tests import cluster  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import helpers  # pylint: disable=g-import-not-at-top,wrong-import-position


def measure(step: int) -> dict:
  with tempfile.TemporaryDirectory() as workdir:
    with cluster.Cluster(pathlib.Path(workdir), 2, [
        f'--config={helpers.PROBE_CONFIG}', '--config.steps=1000000',
        '--config.checkpointing=False', '--config.fail_rank=1',
        f'--config.fail_step={step}', '--config.fail_mode=hang'
    ]) as job:
      exits = job.wait(timeout=900)
  hang = float(re.search(r'probe: hang at ([\d.]+)', exits[1].output).group(1))
  line = helpers.first_line_with(exits[0].output, 'the job stalled') or ''
  why = re.search(r'\(deadline ([^:]+): ([^)]*)', line)
  return {
      'step': step,
      'codes': [exits[r].code for r in (0, 1)],
      'hang_to_exit_s': [round(exits[r].at - hang, 1) for r in (0, 1)],
      'deadline_s': why.group(1) if why else None,
      'deadline': why.group(2).split(':')[0] if why else None
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', default='2,10,20')
  parser.add_argument('--rounds', type=int, default=1)
  args = parser.parse_args()
  for _ in range(args.rounds):
    for step in (int(s) for s in args.steps.split(',')):
      print(json.dumps(measure(step)), flush=True)


if __name__ == '__main__':
  main()
