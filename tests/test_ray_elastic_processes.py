"""An elastic job on a real Ray cluster (launcher/ray/elastic.py): a node
dies, the job goes on at once on the others, and grows back onto a node
Ray adds.

4 processes x 2 devices on 4 raylets (tests/ray_cluster.py), --min_processes
=3: the raylet of one rank's node is killed at step 20 (as a machine that
vanishes: `Cluster.remove_node(allow_graceful=False)`). The driver hears
nothing from that node's actor, tells the others its host may be gone (they
take it for lost after a few seconds without a heartbeat, not after Ray's
own verdict), and starts the job again at once on 3 nodes, restored from
the survivors' local copies. Once a fifth raylet joins, every process saves
the step they agree on and the job grows back to 4. The census of what was
trained (tests/workloads/census.py) equals, exactly, what the data order
says an uninterrupted run trains (test_census holds that such a run's
census is that), with no help from the workload.

With sharded state each process is a replica (--min_replicas=3) with a
local tier of its own, as a host has: the process on the added node finds
no copy beside it and restores its shards from a survivor's (`peer`).
"""

import time

import numpy as np
import pytest

from tests import helpers
from tests import ray_cluster  # Before Ray: it keeps Ray on 127.0.0.1.
from tests.workloads import census

pytest.importorskip('ray')

pytestmark = [pytest.mark.processes, pytest.mark.timeout(360)]

STEPS, BATCH, EXAMPLES, EVERY = 100, 40, 400, 5
PROBE = [
    f'--config={helpers.PROBE_CONFIG}', f'--config.steps={STEPS}',
    f'--config.global_batch_size={BATCH}',
    f'--config.data.num_examples={EXAMPLES}', '--config.log_every=5',
    f'--config.local_checkpoint_every={EVERY}', '--config.checkpoint_every=50',
    '--config.step_seconds=0.05', '--config.nan_on_padding=True',
    '--config.census=True'
]

# The state as each process's whole copy, and sharded with each process a
# replica: (config flags, podrun-ray's minimum).
STATE = {
    'replicated': ((), '--min_processes=3'),
    'sharded': (
        ('--config.state_layout=sharded', '--config.ballast_floats=4096',
         '--config.per_rank_local_dir=True'), '--min_replicas=3'),
}


@pytest.mark.parametrize('state', sorted(STATE))
def test_a_dead_node_shrinks_the_job_and_a_new_one_grows_it(tmp_path, state):
  """About 60 s alone, 100 s beside test_ray_processes' cluster: a 4-node
  cluster of its own (the test adds a node and kills one, which the other
  Ray tests' cluster must not see), and three attempts on it."""
  workdir = tmp_path / 'ray'
  flags, minimum = STATE[state]
  with ray_cluster.RayCluster(nodes=4) as cluster:
    proc = ray_cluster.start_podrun_ray(
        cluster.address, 4,
        [*PROBE, *flags, '--local_devices=2', f'--workdir={workdir}'], minimum)
    started = time.monotonic()
    seen = []  # What the test reads itself, which `finish` then misses.
    try:
      ray_cluster.read_until(proc.stderr, 'step 20/', seen)
      rank, node = cluster.rank_off_the_head(workdir)
      cluster.remove_node_of(node)
      ray_cluster.read_until(proc.stderr, 'starting again at once on 3 of 4',
                             seen)
      cluster.cluster.add_node(**ray_cluster.NODE)
      rest = helpers.finish(proc, 240, started)
    finally:
      helpers.kill_group(proc)
    said = ''.join(seen) + rest.stderr
    assert rest.returncode == 0, said
    assert f'rank(s) {rank} not answering for' in said, said
    assert f'rank {rank} lost: its node {node[:12]} is gone' in said
    assert 'growing from 3 process(es)' in said
    assert '1 shrink(s), 1 growth(s) and 0 wait(s)' in said
    job_id = helpers.read_json(workdir / 'logs' / 'job.json')['job_id']
    assert helpers.wait_for(
        lambda: not helpers.processes_with_env(f'PODRUN_JOB_ID={job_id}'), 10)
    assert helpers.wait_for(lambda: not cluster.live_placement_groups(), 10)

  attempts = helpers.read_jsonl(workdir / 'logs' / 'attempts.jsonl')
  assert [(a['processes'], a['exit_code'], a.get('resize')) for a in attempts
         ] == [(4, 137, 'shrink'), (3, 75, 'grow'), (4, 0, None)]
  # The survivors restored their own copies: at most two local copies'
  # worth trained again (the kill may tear one); the stop to grow saved.
  recomputed = [
      helpers.read_json(workdir / 'goodput' / a['name'] /
                        'rank_0.json')['notes'].get('recomputed_steps') or 0
      for a in attempts
  ]
  assert recomputed[2] == 0 and sum(recomputed) <= 2 * EVERY, recomputed
  if state == 'sharded':
    # The stop to grow saved a local copy: the survivors restore their own,
    # the process on the added node a peer's, with its bytes and seconds.
    notes = [
        helpers.read_json(workdir / 'goodput' / attempts[2]['name'] /
                          f'rank_{r}.json')['notes'] for r in range(4)
    ]
    assert sorted(
        n['restore_tier'] for n in notes) == ['local'] * 3 + ['peer'], notes
    assert len({n['restore_step'] for n in notes}) == 1, notes
    peer = next(n for n in notes if n['restore_tier'] == 'peer')
    assert peer['restore_bytes'] > 0 and peer['restore_s'] > 0, notes
  rows = helpers.read_jsonl(workdir / 'metrics.jsonl')
  assert {(r['num_processes'], r['num_devices']) for r in rows} == {(4, 8),
                                                                    (3, 6)}
  trained = census.counts(helpers.final_state(workdir)['params'])
  assert trained.steps == STEPS
  np.testing.assert_array_equal(trained.examples,
                                census.expected(BATCH, EXAMPLES, 0, STEPS))
