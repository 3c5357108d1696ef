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

  python tests/benchmarks/benchmark_ray.py [--steps=200] [--kill_at=40]
      [--add_at=120] [--runs=2] [--jaxtrainer]

With --jaxtrainer (it needs `pip install "ray[train]"`, which no extra of
the project installs), Ray Train's JaxTrainer runs beside it on the same
kind of cluster: a training function of its own that does what the job
must do itself there (each step's examples derived from the step number,
split by the current world size; a count per example in the state; a
checkpoint every 25 steps through `ray.train.report`), 2 CPU devices a
worker (`JaxConfig(use_gpu=True)` with JAX_PLATFORMS=cpu: with its
defaults it never calls jax.distributed.initialize on CPU), the raylet of
a node killed at step --kill_at: once with 4 workers and a raylet added
11 s later, once with `num_workers=(3, 4)` and none added. Prints the
seconds from `fit()` to the first step and from the kill to the first step
after the restart, the steps trained again, and the census of its last
checkpoint: examples missed or counted twice against the data order.
"""

import argparse
import os
import re
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
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
  return [
      f'--config={helpers.PROBE_CONFIG}', '--local_devices=2',
      f'--config.steps={steps}', f'--config.global_batch_size={BATCH}',
      f'--config.data.num_examples={EXAMPLES}', '--config.log_every=1',
      '--config.local_checkpoint_every=5', '--config.checkpoint_every=100',
      '--config.step_seconds=0.05', '--config.census=True',
      '--config.nan_on_padding=True'
  ]


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
  attempts = helpers.read_jsonl(os.path.join(workdir, 'logs', 'attempts.jsonl'))
  recomputed = sum(
      helpers.read_json(
          os.path.join(workdir, 'goodput', a['name'], 'rank_0.json'))
      ['notes'].get('recomputed_steps') or 0 for a in attempts)
  counts = census.counts(helpers.final_state(workdir)['params'])
  exact = (counts.steps == steps and (counts.examples == census.expected(
      BATCH, EXAMPLES, 0, steps)).all())
  return {
      'marks': marks,
      'code': proc.returncode,
      'recomputed': recomputed,
      'census_exact': bool(exact),
      'processes': [a['processes'] for a in attempts]
  }


def report(result: dict) -> None:
  marks = result['marks']
  for name, at in sorted(marks.items(), key=lambda kv: kv[1]):
    base = 'add' if 'add' in marks and at >= marks['add'] else 'kill'
    print(f'  {name:24s} {at - marks[base]:6.2f} s after the {base}')
  print(f'  attempts on {result["processes"]} processes, exit code '
        f'{result["code"]}, {result["recomputed"]} step(s) recomputed, '
        f'census exact: {result["census_exact"]}')


def _jaxtrainer_loop(config: dict) -> None:
  """One JaxTrainer worker: a linear model and a count per example, the
  step's examples and their split derived from the step number and the
  world size, a checkpoint every 25 steps; rank 0 logs each step."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from ray import train  # pylint: disable=g-import-not-at-top
  context = train.get_context()
  rank, size = context.get_world_rank(), context.get_world_size()
  counts, w, start = np.zeros(EXAMPLES, np.float32), np.zeros(4, np.float32), 0
  checkpoint = train.get_checkpoint()
  if checkpoint:
    with checkpoint.as_directory() as directory:
      saved = np.load(os.path.join(directory, 'state.npz'))
      counts, w, start = saved['counts'], saved['w'], int(saved['step'])

  def step(w, counts, x, ids):
    grad = jax.lax.pmean(
        jax.grad(lambda w: jnp.mean((x @ w - x.sum(-1))**2))(w), 'i')
    seen = jax.lax.psum(jnp.zeros_like(counts).at[ids].add(1.0), 'i')
    return w - 0.1 * grad, counts + seen

  step = jax.pmap(step, 'i', in_axes=(None, None, 0, 0), out_axes=None)
  devices = jax.local_device_count()
  for s in range(start, config['steps']):
    share = BATCH // size
    ids = ((s * BATCH + np.arange(BATCH)) % EXAMPLES)[rank * share:(rank + 1) *
                                                      share]
    ids = ids[:len(ids) // devices * devices].reshape(devices, -1)
    x = np.random.default_rng(s).normal(size=ids.shape + (4,)).astype(
        np.float32)
    w, counts = (np.asarray(v) for v in step(w, counts, x, ids))
    time.sleep(0.05)
    if rank == 0:
      with open(config['log'], 'a') as f:
        f.write(f'{time.time():.3f} {s + 1} {size}\n')
    if (s + 1) % 25 and s + 1 != config['steps']:
      continue
    if rank == 0:
      directory = tempfile.mkdtemp()
      np.savez(os.path.join(directory, 'state.npz'),
               counts=counts,
               w=w,
               step=s + 1)
      train.report({'step': s + 1},
                   checkpoint=train.Checkpoint.from_directory(directory))
    else:
      train.report({'step': s + 1})


def run_jaxtrainer(steps: int, kill_at: int, elastic: bool) -> dict:
  """JaxTrainer on a fresh 4-node cluster: a node's raylet killed at step
  `kill_at`; with `elastic` num_workers=(3, 4), else 4 and a raylet added
  11 s after the kill."""
  import threading  # pylint: disable=g-import-not-at-top
  from ray.train import FailureConfig, RunConfig, ScalingConfig  # pylint: disable=g-import-not-at-top
  from ray.train.v2.jax import JaxTrainer  # pylint: disable=g-import-not-at-top
  from ray.train.v2.jax.config import JaxConfig  # pylint: disable=g-import-not-at-top
  # The raylets pass these to the workers they start.
  os.environ.update({
      'RAY_TRAIN_V2_ENABLED': '1',
      'JAX_PLATFORMS': 'cpu',
      'XLA_FLAGS': '--xla_force_host_platform_device_count=2'
  })
  work = tempfile.mkdtemp(prefix='benchmark_jaxtrainer_')
  log = os.path.join(work, 'steps.log')
  open(log, 'w').close()
  with ray_cluster.RayCluster(nodes=4) as cluster:
    trainer = JaxTrainer(
        _jaxtrainer_loop,
        train_loop_config={
            'steps': steps,
            'log': log
        },
        jax_config=JaxConfig(use_gpu=True),
        scaling_config=ScalingConfig(num_workers=(3, 4) if elastic else 4,
                                     resources_per_worker={'host': 1}),
        run_config=RunConfig(storage_path=os.path.join(work, 'store'),
                             failure_config=FailureConfig(max_failures=3)))
    ended = {}
    fit = threading.Thread(target=lambda: ended.update(r=trainer.fit()),
                           daemon=True)
    began = time.time()
    fit.start()
    killed = None
    while fit.is_alive() and killed is None:
      with open(log) as f:
        if sum(1 for _ in f) >= kill_at:
          workers = [
              n for n in cluster.cluster.list_all_nodes()
              if n is not cluster.cluster.head_node
          ]
          killed = time.time()
          cluster.cluster.remove_node(workers[-1], allow_graceful=False)
          if not elastic:
            time.sleep(11)
            cluster.cluster.add_node(**ray_cluster.NODE)
      time.sleep(0.05)
    fit.join()
  with open(log) as f:
    rows = [(float(t), int(s), int(w)) for t, s, w in map(str.split, f)]
  after = next(r for r, before in zip(rows[1:], rows)
               if r[0] > killed and r[1] <= before[1])
  return {
      'to_first_step': rows[0][0] - began,
      'kill_to_step': after[0] - killed,
      'resumed_at': after[1] - 1,
      'workers_after': after[2],
      'recomputed': len(rows) - steps,
      **_jaxtrainer_census(ended['r'].checkpoint, steps)
  }


def _jaxtrainer_census(checkpoint, steps: int) -> dict:
  """The final checkpoint's count per example against what the data order
  says `steps` steps train: each step's BATCH examples once."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  expected = np.zeros(EXAMPLES)
  for s in range(steps):
    np.add.at(expected, (s * BATCH + np.arange(BATCH)) % EXAMPLES, 1)
  with checkpoint.as_directory() as directory:
    saved = np.load(os.path.join(directory, 'state.npz'))
    counts, step = saved['counts'], int(saved['step'])
  return {
      'census_exact': bool(step == steps and np.array_equal(counts, expected)),
      'examples_missed': int(np.clip(expected - counts, 0, None).sum()),
      'examples_twice': int(np.clip(counts - expected, 0, None).sum())
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--steps', type=int, default=200)
  parser.add_argument('--kill_at', type=int, default=40)
  parser.add_argument('--add_at', type=int, default=120)
  parser.add_argument('--runs', type=int, default=2)
  parser.add_argument('--jaxtrainer', action='store_true')
  args = parser.parse_args()
  for run in range(1, args.runs + 1):
    print(f'run {run}:')
    report(run_once(args.steps, args.kill_at, args.add_at))
  if args.jaxtrainer:
    for elastic in (False, True):
      case = ('num_workers=(3, 4)'
              if elastic else '4 workers, a node back 11 s after the kill')
      print(f'JaxTrainer, {case}: '
            f'{run_jaxtrainer(args.steps, args.kill_at, elastic)}')


if __name__ == '__main__':
  main()
