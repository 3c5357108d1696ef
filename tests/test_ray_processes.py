"""The job on a real Ray cluster (tests/ray_cluster.py: 4 raylets on
127.0.0.1): one process per node through a STRICT_SPREAD placement group,
the same result as a local pod of the same shape, and nothing of the job
left on any node afterwards."""

import signal
import time

import pytest

from tests import helpers
from tests import ray_cluster  # Before Ray: it keeps Ray on 127.0.0.1.

pytest.importorskip('ray')

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

LINEAR = [
    '--config=configs/linear_regression.py', '--config.steps=60',
    '--local_devices=2'
]


@pytest.fixture(scope='module')
def cluster():
  with ray_cluster.RayCluster(nodes=4) as running:
    yield running


def _no_job_left(cluster, workdir) -> None:
  """No process of the job on any node, and no placement group left."""
  job_id = helpers.read_json(workdir / 'logs' / 'job.json')['job_id']
  assert helpers.wait_for(
      lambda: not helpers.processes_with_env(f'PODRUN_JOB_ID={job_id}'), 10)
  assert helpers.wait_for(lambda: not cluster.live_placement_groups(),
                          10), (cluster.live_placement_groups())


def test_four_nodes_train_as_a_local_4x2_pod(cluster, tmp_path):
  """About 25 s: the Ray job, then the local pod it must equal."""
  on_ray = tmp_path / 'ray'
  result = ray_cluster.run_podrun_ray(cluster.address, 4,
                                      [*LINEAR, f'--workdir={on_ray}'])
  assert result.returncode == 0, result.output
  assert 'started 4 processes, one a node' in result.stderr
  summary = helpers.read_json(on_ray / 'summary.json')
  assert (summary['process_count'], summary['device_count']) == (4, 8)
  # Every rank's log, filed by the driver, and one job.json.
  job = helpers.read_json(on_ray / 'logs' / 'job.json')
  assert [r['rank'] for r in job['ranks']] == [0, 1, 2, 3]
  for rank in range(4):
    assert (on_ray / 'logs' / f'rank_{rank}.log').stat().st_size > 0
  _no_job_left(cluster, on_ray)

  local = tmp_path / 'local'
  pod = helpers.run_launcher(
      [*LINEAR, f'--workdir={local}', '--local_processes=4'])
  assert pod.returncode == 0, pod.output
  assert (helpers.fingerprints(on_ray, 4) == helpers.fingerprints(local, 4))
  assert len(set(helpers.fingerprints(on_ray, 4))) == 1


def test_more_processes_than_nodes_is_refused_naming_both(cluster, tmp_path):
  result = ray_cluster.run_podrun_ray(cluster.address,
                                      5, [*LINEAR, f'--workdir={tmp_path}'],
                                      '--start_timeout=3',
                                      timeout=60)
  assert result.returncode == 6, result.output
  assert ('--num_processes=5 needs 5 nodes with --resources_per_process='
          "{'host': 1.0} each" in result.stderr), result.stderr
  assert '4 of the 4 node(s) hold one' in result.stderr
  assert helpers.wait_for(lambda: cluster.free_hosts() == 4, 10)


def test_a_failing_process_ends_the_job_with_its_code(cluster, tmp_path):
  """A user's error on rank 2 (exit 7 at step 5) ends every process and the
  job with 7: the root cause, not the peers' 10. The user's --env reached
  every process; the nodes never saw the driver's shell."""
  result = ray_cluster.run_podrun_ray(cluster.address, 4, [
      f'--config={helpers.PROBE_CONFIG}', '--local_devices=2',
      f'--workdir={tmp_path}', '--config.steps=40', '--config.fail_rank=2',
      '--config.fail_step=5', '--config.fail_mode=podrun_error',
      '--config.fail_code=7', '--config.echo_env=PROBE_API_KEY'
  ], '--stop_grace=20', '--env=PROBE_API_KEY=from the driver')
  assert result.returncode == 7, result.output
  assert 'rank 2 ended with exit code 7' in result.stderr, result.stderr
  for rank in range(4):
    log = (tmp_path / 'logs' / f'rank_{rank}.log').read_text()
    assert 'probe: env PROBE_API_KEY=from the driver' in log, log[-2000:]
  _no_job_left(cluster, tmp_path)


def test_a_retried_failure_starts_again_on_a_fresh_placement_group(
    cluster, tmp_path):
  """About 25 s: exit 7 on rank 1 at step 5 of the first attempt, retried
  (--retry_exit_codes=7 --max_restarts=1): the second attempt, on new
  bundles, trains to the end."""
  result = ray_cluster.run_podrun_ray(cluster.address, 4, [
      f'--config={helpers.PROBE_CONFIG}', '--local_devices=2',
      f'--workdir={tmp_path}', '--config.steps=30', '--config.fail_rank=1',
      '--config.fail_step=5', '--config.fail_mode=podrun_error',
      '--config.fail_code=7', '--config.fail_once=True'
  ], '--max_restarts=1', '--retry_exit_codes=7', '--stop_grace=20')
  assert result.returncode == 0, result.output
  assert 'restart 1/1 after retryable exit code 7' in result.stderr
  attempts = helpers.read_jsonl(tmp_path / 'logs' / 'attempts.jsonl')
  assert [(a['attempt'], a['exit_code'], a['processes']) for a in attempts
         ] == [(1, 7, 4), (2, 0, 4)]
  assert helpers.read_json(tmp_path / 'logs' / 'job.json')['attempt'] == 2
  assert '===== attempt 2 =====' in (tmp_path / 'logs' /
                                     'rank_1.log').read_text()
  _no_job_left(cluster, tmp_path)


def test_a_sigterm_is_a_preemption_notice_and_the_job_resumes_exactly(
    cluster, tmp_path):
  """About 45 s: podrun-ray SIGTERMed at step 20 ends 75 after every
  process saved the step they agreed on; a second podrun-ray resumes there
  and ends with the parameters of a local 4x2 pod that never stopped."""
  probe = [
      f'--config={helpers.PROBE_CONFIG}', '--local_devices=2',
      '--config.steps=120', '--config.step_seconds=0.05',
      '--config.log_every=10'
  ]
  workdir = tmp_path / 'ray'
  proc = ray_cluster.start_podrun_ray(cluster.address, 4,
                                      [*probe, f'--workdir={workdir}'])
  started = time.monotonic()
  try:
    for line in proc.stderr:
      if 'step 20/120' in line:
        break
    proc.send_signal(signal.SIGTERM)
    first = helpers.finish(proc, 120, started)
  finally:
    helpers.kill_group(proc)
  assert first.returncode == 75, first.output
  attempts = helpers.read_jsonl(workdir / 'logs' / 'attempts.jsonl')
  assert [(a['exit_code'], a['launcher_signalled']) for a in attempts
         ] == [(75, True)]
  _no_job_left(cluster, workdir)

  second = ray_cluster.run_podrun_ray(cluster.address, 4,
                                      [*probe, f'--workdir={workdir}'])
  assert second.returncode == 0, second.output
  resumed = helpers.read_json(workdir / 'ranks' / 'rank_0.json')
  assert 20 <= resumed['start_step'] < 120, resumed['start_step']
  straight = tmp_path / 'straight'
  pod = helpers.run_launcher(
      [*probe, f'--workdir={straight}', '--local_processes=4'])
  assert pod.returncode == 0, pod.output
  assert helpers.fingerprints(workdir, 4) == helpers.fingerprints(straight, 4)


def test_a_strangers_bundle_request_waits_and_leaves_the_job_alone(
    cluster, tmp_path):
  """About 15 s: another job asks Ray for a {"host": 1} bundle while this
  one holds every node; it waits, this job trains to its end undisturbed,
  and the stranger gets its bundle once this job is gone."""
  from ray.util.placement_group import placement_group, remove_placement_group  # pylint: disable=g-import-not-at-top
  proc = ray_cluster.start_podrun_ray(cluster.address, 4, [
      f'--config={helpers.PROBE_CONFIG}', '--local_devices=2',
      f'--workdir={tmp_path}', '--config.steps=60',
      '--config.step_seconds=0.05', '--config.log_every=10'
  ])
  started = time.monotonic()
  stranger = None
  try:
    for line in proc.stderr:
      if 'step 10/60' in line:
        break
    stranger = placement_group([{'host': 1}])
    assert not stranger.wait(timeout_seconds=2)
    result = helpers.finish(proc, 120, started)
    assert result.returncode == 0, result.output
    assert stranger.wait(timeout_seconds=30)
  finally:
    helpers.kill_group(proc)
    if stranger is not None:
      remove_placement_group(stranger)
  rows = helpers.read_jsonl(tmp_path / 'metrics.jsonl')
  assert rows[-1]['step'] == 60
  attempts = helpers.read_jsonl(tmp_path / 'logs' / 'attempts.jsonl')
  assert [a['exit_code'] for a in attempts] == [0]


def test_a_drained_node_is_a_preemption_notice(cluster, tmp_path):
  """About 40 s: a 3-process job on the 4 nodes; at step 20 one of its
  nodes is drained with a deadline (`ray drain-node`, as a preemption
  drains it). Every process saves the step they agree on, the attempt ends
  75, and the next attempt, on the nodes Ray still schedules on, resumes
  there with nothing recomputed and ends as a local 3x2 pod that never
  stopped. The drained node stays drained: later tests avoid it."""
  probe = [
      f'--config={helpers.PROBE_CONFIG}', '--local_devices=2',
      '--config.steps=120', '--config.step_seconds=0.05',
      '--config.log_every=10'
  ]
  workdir = tmp_path / 'ray'
  proc = ray_cluster.start_podrun_ray(cluster.address, 3,
                                      [*probe, f'--workdir={workdir}'],
                                      '--max_restarts=1')
  started = time.monotonic()
  try:
    ray_cluster.read_until(proc.stderr, 'step 20/120')
    rank, node = cluster.rank_off_the_head(workdir)
    cluster.drain(node, deadline_s=60)
    result = helpers.finish(proc, 180, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 0, result.output
  assert (f"rank {rank}'s node {node[:12]} is draining (deadline in "
          in result.stderr), result.stderr
  attempts = helpers.read_jsonl(workdir / 'logs' / 'attempts.jsonl')
  assert [(a['exit_code'], a['kind']) for a in attempts] == [(75, 'preempted'),
                                                             (0, 'ok')]
  again = helpers.read_json(workdir / 'logs' / 'job.json')
  assert again['attempt'] == 2
  assert node not in [r['node'] for r in again['ranks']]
  second = helpers.read_json(workdir / 'goodput' / attempts[1]['name'] /
                             'rank_0.json')['notes']
  assert second['restore_step'] >= 20 and not second.get('recomputed_steps')
  straight = tmp_path / 'straight'
  pod = helpers.run_launcher(
      [*probe, f'--workdir={straight}', '--local_processes=3'])
  assert pod.returncode == 0, pod.output
  assert helpers.fingerprints(workdir, 3) == helpers.fingerprints(straight, 3)


def test_a_node_that_dies_is_a_lost_process_and_ends_the_job(cluster, tmp_path):
  """About 20 s: a 3-process job (one node is drained by the test before),
  the raylet of a rank's node killed at step 10. Its actor stops answering
  at once: the others hear that its host may be gone and end within
  seconds, and the driver names the rank lost, without waiting for Ray to
  declare the node dead (about 12 s here). Last
  in the module: the cluster has 3 nodes after it (a node added here would
  be a process the test leaves running)."""
  proc = ray_cluster.start_podrun_ray(cluster.address, 3, [
      f'--config={helpers.PROBE_CONFIG}', '--local_devices=2',
      f'--workdir={tmp_path}', '--config.steps=2000',
      '--config.step_seconds=0.05', '--config.log_every=10'
  ])
  started = time.monotonic()
  try:
    ray_cluster.read_until(proc.stderr, 'step 10/2000')
    rank, node = cluster.rank_off_the_head(tmp_path)
    cluster.remove_node_of(node)
    rest = helpers.finish(proc, 120, started)
  finally:
    helpers.kill_group(proc)
  assert rest.returncode == 137, rest.output
  assert f'rank {rank} lost: its node {node[:12]} is gone' in (
      rest.stderr), rest.stderr
  assert f'rank(s) {rank} not answering for' in rest.stderr
  assert 'exit code 137 (SIGKILL)' in rest.stderr
  _no_job_left(cluster, tmp_path)
