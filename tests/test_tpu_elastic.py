"""Elastic slices against the emulated Cloud TPU (launcher/tpu/elastic.py).

Two spot slices of 2 workers, --min_slices=1: one slice is preempted when
process 0 logs step 15, its recreate waits 3 s for capacity, and the job
trains on the other slice meanwhile, then grows back to both at a step
boundary and ends 0 with its queued resources deleted (slice 1's first
recreate fails: it is tried again after a back-off). Slice 0 (which holds
process 0 and the MEGASCALE coordinator: the survivor takes both over) is
lost once with the VMs' notice (every process saves the agreed step) and
once without (the VMs SIGKILLed: the survivors, renumbered, restore the
local copies their own disks hold); slice 1 without (the driver tells the
survivors that processes 2 and 3 went with their slice, and process 0
ends the attempt after a few seconds of their silence). The census of what
was trained (tests/workloads/census.py) equals the undisturbed run's.
With sharded state each slice is a replica (config.replica='slice',
--min_replicas=1): the survivor goes on with every shard, and the slice
that comes back takes its shards from the survivor's local copies of the
step the stop to grow saved.
"""

import pytest

from tests import helpers
from tests.workloads import census
from tests.test_tpu_fleet import CREATE, NAME, PROBE, _fleet, cleanup  # pylint: disable=unused-import

pytestmark = [pytest.mark.processes, pytest.mark.timeout(400)]

STEPS = 60
LOCAL_EVERY = 5
JOB = [
    *PROBE, '--local_devices=2', f'--config.steps={STEPS}',
    '--config.log_every=1', '--config.global_batch_size=40',
    '--config.step_seconds=0.02', '--config.census=True',
    f'--config.local_checkpoint_every={LOCAL_EVERY}'
]
# On one slice, a second a step: the job outlasts the recreate however
# slow this machine is (a step boundary comes every second to grow at).
SHRUNK = ['--config.slow_below_processes=4', '--config.slow_below_seconds=1']
# Sharded state, each slice a replica (2 workers x 2 devices: the state
# split 4 ways), with a leaf big enough to split.
SHARDED = ('--config.state_layout=sharded', '--config.replica=slice',
           '--config.ballast_floats=4096')


@pytest.fixture(scope='module')
def straights(tmp_path_factory):
  """`(sharded) -> workdir`: 1 x 8 devices, never interrupted (the
  sharded one replicated: one process has no slices to be replicas)."""
  made = {}

  def straight(sharded: bool):
    if sharded not in made:
      workdir = tmp_path_factory.mktemp('straight')
      extra = ['--config.ballast_floats=4096'] if sharded else []
      result = helpers.run_launcher(
          [*JOB, *extra, '--local_devices=8', f'--workdir={workdir}'],
          timeout=200)
      assert result.returncode == 0, result.output
      made[sharded] = workdir
    return made[sharded]

  return straight


@pytest.mark.parametrize('lost, notice, sharded', [(0, True, False),
                                                   (1, False, False),
                                                   (0, False, False),
                                                   (0, True, True),
                                                   (1, False, True)])
def test_a_lost_slice_leaves_the_job_on_the_other_until_it_is_back(
    tmp_path, cleanup, straights, lost, notice, sharded):
  """About 40 s each: two slices' VMs start JAX three times, with a 3 s
  wait for capacity between. With sharded state each slice is a replica
  (--min_replicas): the survivor goes on with every shard, and the slice
  that comes back takes its shards from the survivor's local copies."""
  straight = straights(sharded)
  preempt = ['', '']
  preempt[lost] = 'step 15/'
  # Slice 1's first recreate ends FAILED (the service's third creation):
  # it is tried again after --slice_back_backoff.
  fail_once = {'FAKE_QR_FAIL': '3'} if lost == 1 else {}
  fleet = _fleet(tmp_path,
                 FAKE_QR_PREEMPT_ON_LOG=','.join(preempt),
                 FAKE_QR_LOG_NODE=f'{NAME}-0',
                 FAKE_QR_WAIT_S='0.5,0.5,3',
                 FAKE_TPU_PREEMPT_NOTICE='1' if notice else '0',
                 **fail_once)
  cleanup(fleet)
  workdir = tmp_path / 'work'
  result = fleet.run(*CREATE,
                     '--spot',
                     '--num_slices=2',
                     '--min_replicas=1' if sharded else '--min_slices=1',
                     '--delete_after',
                     '--slice_back_backoff=1',
                     '--',
                     *JOB,
                     *SHRUNK,
                     *(SHARDED if sharded else ()),
                     f'--workdir={workdir}',
                     timeout=330)
  assert result.returncode == 0, result.output
  if fail_once:
    assert (f'slice {NAME}-1 did not come back (try 1): ' in result.stderr and
            'trying again in 1 s' in result.stderr), result.stderr
  if notice:
    # The driver knew when the lost slice's job was over (launcher/tpu/
    # ends.py) rather than waiting out --lost_slice_wait (30 s), which the
    # gcloud sessions' retries to the lost VMs would fill. (Without a
    # notice the survivors end on the heartbeat's timeout, when the lost
    # slice's gcloud may have given up already.)
    assert ('the other slice(s) saved, and what the lost VMs still write '
            'goes with their disks: going on') in result.stderr, result.stderr
  if lost == 1 and not notice:
    # The driver told the survivors which processes went with the slice
    # (launcher/process/peers.py, Gone): process 0 named them lost after a
    # few silent seconds rather than --heartbeat_timeout (15 s). Gloo may
    # abort the survivors first, inside the step they had begun with the
    # dead ('Received data size doesn't match'): then they end 134.
    assert (f'telling the job on {NAME}-0 that processes 2, 3 are gone'
            in result.stderr), result.stderr
    assert ('and the launcher saw its host go' in result.output or
            '[worker 0] podrun: exit 134' in result.output), result.output
  assert (f'slice(s) {NAME}-{lost} lost: starting again at once on '
          in result.stderr), result.stderr
  assert f'slice {NAME}-{lost} is back after' in result.stderr
  assert '1 shrink(s), 1 growth(s)' in result.stderr
  attempts = helpers.read_jsonl(fleet.logs / 'attempts.jsonl')
  assert [(a.get('resize'), a['processes']) for a in attempts] == [('shrink',
                                                                    4),
                                                                   ('grow', 2),
                                                                   (None, 4)]
  assert [a['exit_code'] for a in attempts][1:] == [75, 0]
  rows = helpers.read_jsonl(workdir / 'metrics.jsonl')
  assert {r['num_processes'] for r in rows} == {4, 2}
  assert set(range(1, STEPS + 1)) <= {r['step'] for r in rows}
  ledgers = sorted(
      (helpers.read_json(p) for p in workdir.glob('goodput/*/rank_0.json')),
      key=lambda l: l['started'])
  assert len(ledgers) == 3
  recomputed = [l['notes'].get('recomputed_steps') or 0 for l in ledgers]
  if notice:
    # The VMs' SIGTERM and the driver's: every process saved the step they
    # agreed on, and nothing was trained twice.
    assert sum(recomputed) == 0, recomputed
  else:
    # SIGKILLed: the survivors, whatever their new numbers, restored the
    # copies their own disks hold, not the persistent tier (every 1000).
    shrunk = ledgers[1]['notes']
    assert shrunk['restore_tier'] == 'local', shrunk
    assert shrunk['restore_step'] >= 15 - LOCAL_EVERY, shrunk
    # At most two copies' worth: the kill may tear the newest (and none
    # when it lands right after a copy).
    assert sum(recomputed) <= 2 * LOCAL_EVERY, recomputed
  helpers.assert_trees_close(helpers.final_state(workdir)['params'],
                             helpers.final_state(straight)['params'],
                             rtol=1e-4,
                             atol=1e-6)
  census.assert_exactly_once(
      helpers.final_state(workdir)['params'],
      helpers.final_state(straight)['params'], 40, 4096, STEPS)
  if sharded:
    # The slice that came back (its processes, 2 x `lost` and the next)
    # restored the step the stop to grow saved from the survivors' local
    # copies; the survivors their own.
    grown = [
        helpers.read_json(p)['notes']
        for p in sorted((workdir / 'goodput' /
                         ledgers[2]['notes']['attempt']).glob('rank_*.json'))
    ]
    tiers = ['local'] * 4
    tiers[2 * lost:2 * lost + 2] = ['peer'] * 2
    assert [n['restore_tier'] for n in grown] == tiers, grown
    assert all(n['restore_bytes'] > 0 for n in grown), grown
  assert fleet.queued_resources() == []
  events = [(e['event'], e.get('name')) for e in fleet.events()]
  assert ('preempted', f'{NAME}-{lost}') in events
  assert ('preempted', f'{NAME}-{1 - lost}') not in events


def test_the_dry_run_shows_a_queued_resource_per_slice(tmp_path):
  fleet = _fleet(tmp_path)
  result = fleet.run(*CREATE,
                     '--spot',
                     '--num_slices=2',
                     '--min_slices=1',
                     '--dry_run',
                     '--',
                     *JOB,
                     '--workdir=gs://runs/elastic',
                     timeout=120)
  assert result.returncode == 0, result.output
  creates = [
      l for l in result.stdout.splitlines() if ' queued-resources create ' in l
  ]
  assert [l.split()[5:7] for l in creates
         ] == [[f'{NAME}-0', '--accelerator-type=v4-16'],
               [f'{NAME}-1', '--accelerator-type=v4-16']]
  assert all(f'--node-id={NAME}-{i}' in l for i, l in enumerate(creates))
  assert '# a lost slice: the job relaunches at once on the others' in (
      result.stdout)
  assert not fleet.calls.exists()  # Nothing ran.
