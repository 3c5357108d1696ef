"""podrun-ray on a real local Ray cluster: a node that dies, and one added.

4 raylets on 127.0.0.1 (tests/ray_cluster.py), a 4-process job of 2 CPU
devices each, the probe linear regression with the census of what was
trained (tests/workloads/census.py), local copies every 5 steps. When
process 0 logs step --kill_at, the raylet of a rank's node (not the
head's) is killed at once (`Cluster.remove_node(allow_graceful=False)`);
with --min_processes=3 the job goes on on 3 nodes, and when the job on 3
logs step --add_at a raylet is added, onto which it grows back.

Every driver line is stamped as it arrives. Prints, in seconds after the
kill, the driver seeing the node's actor silent, the survivors taking it
for lost, the driver's shrink, the next attempt's start, its restore and
its first step; after the add, the driver's grow, the next attempt's start
and its first step; then the steps recomputed, the exit code, and whether
the census equals what the data order says of every step (nothing trained
twice or lost).

  python scripts/benchmark_ray.py [--steps=200] [--kill_at=40]
      [--add_at=120] [--runs=2]

Ray Train's JaxTrainer beside it (the issue's figures: 20.6 s to the first
step with a node back, 77.7 s shrinking) is not measured by this script:
it needs `ray[train]`, which the project's extras do not install.
"""

import argparse
import os
import re
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests import helpers  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import ray_cluster  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests.workloads import census  # pylint: disable=g-import-not-at-top,wrong-import-position

BATCH, EXAMPLES = 40, 400
_STEP = re.compile(r'metrics\.py:\d+\] step (\d+)/')
# (mark, what a line holds, the rank prefix it must carry or '').
_MARKS = (
    ('driver: not answering', 'not answering for', ''),
    ('survivors: lost', 'was lost: no heartbeat', ''),
    ('driver: shrink', 'starting again at once on 3', ''),
    ('attempt 2 started', 'attempt 2: started', ''),
    ('attempt 2 restored', 'restored', '[rank 0/3]'),
    ('driver: grow', 'growing from 3', ''),
    ('attempt 3 started', 'attempt 3: started', ''),
)


def _probe(steps: int) -> list[str]:
  return [f'--config={helpers.PROBE_CONFIG}', '--local_devices=2',
          f'--config.steps={steps}', f'--config.global_batch_size={BATCH}',
          f'--config.data.num_examples={EXAMPLES}', '--config.log_every=1',
          '--config.local_checkpoint_every=5', '--config.checkpoint_every=100',
          '--config.step_seconds=0.05', '--config.census=True',
          '--config.nan_on_padding=True']


def _mark(marks: dict[str, float], line: str, now: float) -> None:
  for name, text, prefix in _MARKS:
    if text in line and line.startswith(prefix):
      marks.setdefault(name, now)
  step = _STEP.search(line)
  if step and line.startswith('[rank 0/3]'):
    marks.setdefault('attempt 2 first step', now)
  if step and line.startswith('[rank 0/4]') and 'attempt 3 started' in marks:
    marks.setdefault('attempt 3 first step', now)


def run_once(steps: int, kill_at: int, add_at: int) -> dict:
  """One job on a fresh 4-node cluster; its marks, code and census."""
  marks: dict[str, float] = {}
  workdir = tempfile.mkdtemp(prefix='benchmark_ray_')
  with ray_cluster.RayCluster(nodes=4) as cluster:
    proc = ray_cluster.start_podrun_ray(
        cluster.address, 4, [*_probe(steps), f'--workdir={workdir}'],
        '--min_processes=3')
    started = time.monotonic()
    for line in proc.stderr:
      now = time.monotonic() - started
      _mark(marks, line, now)
      if 'kill' not in marks and f'step {kill_at}/' in line:
        _, node = cluster.rank_off_the_head(workdir)
        cluster.remove_node_of(node)
        marks['kill'] = time.monotonic() - started
      if ('add' not in marks and 'attempt 2 started' in marks and
          line.startswith('[rank 0/3]') and f'step {add_at}/' in line):
        marks['add'] = time.monotonic() - started
        cluster.cluster.add_node(**ray_cluster.NODE)
    proc.wait()
  attempts = helpers.read_jsonl(os.path.join(workdir, 'logs',
                                             'attempts.jsonl'))
  recomputed = sum(helpers.read_json(os.path.join(
      workdir, 'goodput', a['name'], 'rank_0.json'))['notes'].get(
          'recomputed_steps') or 0 for a in attempts)
  counts = census.counts(helpers.final_state(workdir)['params'])
  exact = (counts.steps == steps and
           (counts.examples == census.expected(BATCH, EXAMPLES, 0,
                                               steps)).all())
  return {'marks': marks, 'code': proc.returncode, 'recomputed': recomputed,
          'census_exact': bool(exact),
          'processes': [a['processes'] for a in attempts]}


def report(result: dict) -> None:
  marks = result['marks']
  for name, at in sorted(marks.items(), key=lambda kv: kv[1]):
    base = 'add' if 'add' in marks and at >= marks['add'] else 'kill'
    print(f'  {name:24s} {at - marks[base]:6.2f} s after the {base}')
  print(f'  attempts on {result["processes"]} processes, exit code '
        f'{result["code"]}, {result["recomputed"]} step(s) recomputed, '
        f'census exact: {result["census_exact"]}')


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--steps', type=int, default=200)
  parser.add_argument('--kill_at', type=int, default=40)
  parser.add_argument('--add_at', type=int, default=120)
  parser.add_argument('--runs', type=int, default=2)
  args = parser.parse_args()
  for run in range(1, args.runs + 1):
    print(f'run {run}:')
    report(run_once(args.steps, args.kill_at, args.add_at))


if __name__ == '__main__':
  main()
