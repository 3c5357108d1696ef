"""Four steps per call through faults: the census job of the fault soak
(tests/benchmarks/soak.py) on a 2x4 local pod with
config.steps_per_dispatch=4, SIGKILLed, or given a preemption notice: it
recovers, and every example and step is trained exactly once."""

import pytest

from tests import helpers
from tests.benchmarks import soak

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]

FOUR_PER_CALL = ('--config.steps_per_dispatch=4', '--config.log_every=4',
                 '--config.local_checkpoint_every=4')


@pytest.mark.parametrize('trial', [
    soak.Trial(
        0, 'sigkill_step', 'fixed', target=1, at_step=22, config=FOUR_PER_CALL),
    soak.Trial(
        1, 'preempt_one', 'fixed', target=0, at_step=30, config=FOUR_PER_CALL),
],
                         ids=lambda t: t.fault)
def test_four_steps_per_call_recover_exactly(trial, tmp_path):
  """About 20 s each: the job, its fault, the attempt that resumes, then
  the census and what was left."""
  row = soak.run_trial(trial, tmp_path)
  assert row['success'], {k: v for k, v in row.items()}
  assert row['census_exact'] and not row['left_behind']
  assert row['attempts'] >= 2, row
  logs = ''.join(
      p.read_text(errors='replace')
      for p in (tmp_path / f'trial-{trial.index:03d}' / 'logs').rglob('*')
      if p.is_file())
  assert logs.count('4 step(s) per call') >= row['attempts'], logs[-3000:]


@pytest.mark.parametrize('parallelism', ['pmap', 'shard_map'])
def test_data_on_the_devices_of_two_processes_trains_as_from_the_hosts(
    parallelism, tmp_path):
  """About 30 s: the MLP on a 2x4 local pod, four steps a call, its data
  read on the hosts and then kept on the devices: every rank ends with the
  same parameters both ways."""
  prints = {}
  for on_device in (False, True):
    workdir = tmp_path / str(on_device)
    result = helpers.run_launcher([
        '--config=configs/mlp.py', '--local_processes=2', '--local_devices=4',
        '--config.steps=16', '--config.steps_per_dispatch=4',
        '--config.log_every=4', f'--config.parallelism={parallelism}',
        f'--config.data.on_device={on_device}', f'--workdir={workdir}'
    ],
                                  timeout=240)
    assert result.returncode == 0, result.output[-3000:]
    said = ('the data set on the devices'
            if on_device else 'batches from the host')
    assert said in result.output, result.output[-3000:]
    prints[on_device] = [
        helpers.read_json(workdir / 'ranks' / f'rank_{i}.json')['fingerprint']
        for i in range(2)
    ]
  assert prints[False][0] == prints[False][1], prints
  assert prints[True] == prints[False], prints
