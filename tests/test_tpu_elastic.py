"""Elastic slices against the emulated Cloud TPU (launcher/tpu/elastic.py).

Two spot slices of 2 workers, --min_slices=1: one slice is preempted when
process 0 logs step 15, its recreate waits 3 s for capacity, and the job
trains on the other slice meanwhile, then grows back to both at a step
boundary and ends 0 with its queued resources deleted. Once slice 1 is
lost, once slice 0 (which holds process 0 and the MEGASCALE coordinator:
the survivor takes both over).
"""

import pytest

from tests import helpers
from tests.test_tpu_fleet import CREATE, NAME, PROBE, _fleet, cleanup  # pylint: disable=unused-import

pytestmark = [pytest.mark.processes, pytest.mark.timeout(400)]

STEPS = 60
JOB = [*PROBE, '--local_devices=2', f'--config.steps={STEPS}',
       '--config.log_every=1', '--config.global_batch_size=40',
       '--config.step_seconds=0.02']
# On one slice, a second a step: the job outlasts the recreate however
# slow this machine is (a step boundary comes every second to grow at).
SHRUNK = ['--config.slow_below_processes=4', '--config.slow_below_seconds=1']


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
  """1 x 8 devices, never interrupted."""
  workdir = tmp_path_factory.mktemp('straight')
  result = helpers.run_launcher([*JOB, '--local_devices=8',
                                 f'--workdir={workdir}'], timeout=200)
  assert result.returncode == 0, result.output
  return workdir


@pytest.mark.parametrize('lost', [1, 0])
def test_a_lost_slice_leaves_the_job_on_the_other_until_it_is_back(
    tmp_path, cleanup, straight, lost):
  preempt = ['', '']
  preempt[lost] = 'step 15/'
  fleet = _fleet(tmp_path, FAKE_QR_PREEMPT_ON_LOG=','.join(preempt),
                 FAKE_QR_LOG_NODE=f'{NAME}-0', FAKE_QR_WAIT_S='0.5,0.5,3')
  cleanup(fleet)
  workdir = tmp_path / 'work'
  # A VM is killed 2 s into its shutdown here: 5 s is time enough for the
  # lost slice's save, and the gcloud sessions' retries take longer.
  result = fleet.run(*CREATE, '--spot', '--num_slices=2', '--min_slices=1',
                     '--delete_after', '--lost_slice_wait=5', '--', *JOB,
                     *SHRUNK, f'--workdir={workdir}', timeout=330)
  assert result.returncode == 0, result.output
  assert (f'slice(s) {NAME}-{lost} lost: relaunching at once on the others'
          in result.stderr), result.stderr
  assert f'slice {NAME}-{lost} is back after' in result.stderr
  assert '1 shrink(s), 1 growth(s)' in result.stderr
  attempts = helpers.read_jsonl(fleet.logs / 'attempts.jsonl')
  assert [(a['exit_code'], a.get('resize'), a['processes'])
          for a in attempts] == [(75, 'shrink', 4), (75, 'grow', 2),
                                 (0, None, 4)]
  rows = helpers.read_jsonl(workdir / 'metrics.jsonl')
  assert {r['num_processes'] for r in rows} == {4, 2}
  assert set(range(1, STEPS + 1)) <= {r['step'] for r in rows}
  # Both stops came with a notice (the VMs' SIGTERM, the driver's): every
  # process saved the step they agreed on, and nothing was trained twice.
  ledgers = [helpers.read_json(p) for p in workdir.glob('goodput/*/rank_0.json')]
  assert len(ledgers) == 3
  assert sum(l['notes'].get('recomputed_steps') or 0 for l in ledgers) == 0
  helpers.assert_trees_close(helpers.final_state(workdir)['params'],
                             helpers.final_state(straight)['params'],
                             rtol=1e-4, atol=1e-6)
  assert fleet.queued_resources() == []
  events = [(e['event'], e.get('name')) for e in fleet.events()]
  assert ('preempted', f'{NAME}-{lost}') in events
  assert ('preempted', f'{NAME}-{1 - lost}') not in events


def test_the_dry_run_shows_a_queued_resource_per_slice(tmp_path):
  fleet = _fleet(tmp_path)
  result = fleet.run(*CREATE, '--spot', '--num_slices=2', '--min_slices=1',
                     '--dry_run', '--', *JOB, '--workdir=gs://runs/elastic',
                     timeout=120)
  assert result.returncode == 0, result.output
  creates = [l for l in result.stdout.splitlines()
             if ' queued-resources create ' in l]
  assert [l.split()[5:7] for l in creates] == [
      [f'{NAME}-0', '--accelerator-type=v4-16'],
      [f'{NAME}-1', '--accelerator-type=v4-16']]
  assert all(f'--node-id={NAME}-{i}' in l for i, l in enumerate(creates))
  assert '# a lost slice: the job relaunches at once on the others' in (
      result.stdout)
  assert not fleet.calls.exists()  # Nothing ran.
