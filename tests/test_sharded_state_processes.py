"""config.state_layout='sharded' on local pods: MNIST's MLP with Adam
trains as the replicated state does, to float rounding, on 2x4, 4x2 (with
2 microbatches) and 1x8."""

import pathlib
import shutil

import jax
import numpy as np
import pytest

from runtime.workloads import mnist
from tests import helpers
from tests.benchmarks import soak

pytestmark = pytest.mark.processes


def _run(tmp_path, name: str, layout: str, processes: int, devices: int, *extra:
         str) -> tuple[dict, str]:
  workdir = tmp_path / name
  result = helpers.run_launcher([
      '--config=configs/mnist.py', f'--config.data_dir={tmp_path}/data',
      '--config.model.hidden_sizes=(64,)', '--config.steps=20',
      '--config.global_batch_size=64', '--config.parallelism=shard_map',
      f'--config.state_layout={layout}', f'--local_processes={processes}',
      f'--local_devices={devices}', f'--workdir={workdir}', *extra
  ],
                                timeout=180)
  assert result.returncode == 0, result.output
  return helpers.final_state(workdir), result.output


@pytest.mark.timeout(400)
def test_the_sharded_state_trains_as_the_replicated_one(tmp_path):
  """About 60 s: six pods (replicated 2x4, then sharded 2x4, 4x2, 1x8, 2x4
  as one replica and 2x4 split as config.shard_dims says), each a few
  seconds of start-up; the comparison is the point."""
  mnist.write_synthetic(str(tmp_path / 'data'), num_train=1024, num_test=64)
  want, _ = _run(tmp_path, 'replicated', 'replicated', 2, 4)
  for name, processes, devices, extra, said in (
      ('2x4', 2, 4, (), '2 replica(s) (one per process) of 4 device(s)'),
      ('4x2', 4, 2, ('--config.microbatches=2',),
       '4 replica(s) (one per process) of 2 device(s)'),
      ('1x8', 1, 8, (), '1 replica(s) (one per process) of 8 device(s)'),
      # One replica across both processes: the host copies are gathered.
      ('2x4-all', 2, 4, ('--config.replica=all',),
       '1 replica(s) (every device) of 8 device(s)'),
      # The user's split: layer 0's kernel (784, 64) along 784, layer 1
      # whole, which the console then lists.
      ('2x4-dims', 2, 4, ('--config.shard_dims=layer_0/w=0,layer_1/*=whole',),
       "2 replica(s) (one per process) of 4 device(s); state per device "
       "154.8 KiB: 147.2 KiB of it split 4 ways, 7.6 KiB whole (7 leaves "
       "kept whole, that 4 does not divide or an override keeps: "
       "params/layer_1/w (64, 10), opt_state/0/mu/layer_1/w (64, 10), "
       "opt_state/0/nu/layer_1/w (64, 10), and 4 more)")):
    got, output = _run(tmp_path, name, 'sharded', processes, devices, *extra)
    assert f'state sharded: {said}' in output, output
    helpers.assert_trees_close(got['params'],
                               want['params'],
                               rtol=1e-5,
                               atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(got['opt_state']),
                    jax.tree_util.tree_leaves(want['opt_state']),
                    strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert np.array_equal(got['rng'], want['rng'])


@pytest.mark.timeout(120)
def test_sharded_state_chooses_shard_map_and_refuses_pmap_named(tmp_path):
  chosen = helpers.run_launcher([
      '--config=configs/linear_regression.py', '--config.steps=2',
      '--config.state_layout=sharded', '--local_processes=1',
      '--local_devices=2', f'--workdir={tmp_path}/chosen'
  ],
                                timeout=100)
  assert chosen.returncode == 0, chosen.output
  assert ('parallelism shard_map, chosen for it (pmap holds every argument '
          'whole)') in chosen.output, chosen.output
  refused = helpers.run_launcher([
      '--config=configs/linear_regression.py', '--config.steps=2',
      '--config.state_layout=sharded', '--config.parallelism=pmap',
      '--local_processes=1', '--local_devices=2',
      f'--workdir={tmp_path}/refused'
  ],
                                 timeout=100)
  assert refused.returncode != 0
  assert "set config.parallelism='shard_map'" in refused.output, (
      refused.output)


# The probe regression with 4096 floats of ballast, which 4 and 2 devices
# divide, so the state has a leaf split over each replica.
PROBE = [
    f'--config={helpers.PROBE_CONFIG}', '--config.steps=60',
    '--config.log_every=5', '--config.checkpoint_every=1000',
    '--config.local_checkpoint_every=10', '--config.ballast_floats=4096',
    '--config.parallelism=shard_map', '--config.state_layout=sharded'
]
KILL = [
    '--config.fail_rank=1',
    '--config.fail_step=35',
    '--config.fail_mode=sigkill',
    '--config.fail_once=True',
    '--max_restarts=1',
    '--retry_exit_codes=137',
    '--restart_backoff=0.5',
    # Each process's local tier on a "host" of its own.
    '--config.per_rank_local_dir=True'
]


@pytest.mark.timeout(300)
def test_a_sharded_job_resumes_bit_exact_after_a_sigkill_and_on_4x2(tmp_path):
  """About 30 s: an undisturbed sharded 2x4 run, the same run with process
  1 SIGKILLed at step 35 and restarted from the local tier, which must end
  on the same bits, then the undisturbed one resumed on 4x2."""
  pod = ['--local_processes=2', '--local_devices=4']
  straight = helpers.run_launcher(
      [*PROBE, *pod, f'--workdir={tmp_path}/straight'], timeout=150)
  assert straight.returncode == 0, straight.output
  killed = helpers.run_launcher(
      [*PROBE, *pod, *KILL, f'--workdir={tmp_path}/killed'], timeout=150)
  assert killed.returncode == 0, killed.output
  assert 'after 1 restart(s)' in killed.output, killed.output
  want = helpers.fingerprints(tmp_path / 'straight', 2)
  assert helpers.fingerprints(tmp_path / 'killed', 2) == want
  resumed = helpers.run_launcher([
      *PROBE, '--config.steps=80', '--local_processes=4', '--local_devices=2',
      f'--workdir={tmp_path}/straight'
  ],
                                 timeout=150)
  assert resumed.returncode == 0, resumed.output
  assert 'resuming at step 60' in resumed.output, resumed.output
  assert 'state sharded: 4 replica(s) (one per process) of 2 device(s)' in (
      resumed.output)


@pytest.mark.timeout(300)
def test_4_mib_shards_across_processes_agree_with_one_process(tmp_path):
  """About 30 s: a guard on the collectives (jax #40830: a reduce-scatter
  through gloo returned wrong values at 4 MiB shards on a JAX 0.12
  development build). MNIST's MLP with a hidden layer of 10752, whose
  kernel (784 x 10752 floats) split 8 ways is 4.0 MiB a device, sharded as
  one replica over two processes, so its gathers and reductions cross
  gloo, against the replicated state in one process. The sharded step
  sums each gradient in another order (one reduce-scatter of the whole
  batch's gradient), so an element may part by rounding that Adam's
  division amplifies: 1.2e-6 of 2.1e-2 seen, under the 5e-6 allowed."""
  mnist.write_synthetic(str(tmp_path / 'data'), num_train=256, num_test=64)
  common = ['--config.model.hidden_sizes=(10752,)', '--config.steps=3']
  want, _ = _run(tmp_path, 'one-process', 'replicated', 1, 8, *common)
  got, output = _run(tmp_path, 'two-processes', 'sharded', 2, 4, *common,
                     '--config.replica=all')
  assert 'split 8 ways' in output, output
  helpers.assert_trees_close(got['params'],
                             want['params'],
                             rtol=1e-5,
                             atol=5e-6)


def _probe(tmp_path, name: str, steps: int, processes: int, devices: int,
           *extra: str) -> str:
  result = helpers.run_launcher([
      *PROBE[:-2], f'--config.steps={steps}', '--config.checkpoint_every=20',
      '--config.parallelism=shard_map', f'--local_processes={processes}',
      f'--local_devices={devices}', f'--workdir={tmp_path}/{name}', *extra
  ],
                                timeout=150)
  assert result.returncode == 0, result.output
  return result.output


def _written_by_process(item) -> dict[int, int]:
  """{process: bytes} of the files in orbax's per-process stores of a
  checkpoint item (ocdbt.process_<i>/)."""
  return {
      int(p.name.rsplit('_', 1)[1]):
          sum(f.stat().st_size for f in p.rglob('*') if f.is_file())
      for p in item.glob('ocdbt.process_*')
  }


@pytest.mark.timeout(400)
def test_the_persistent_tier_holds_each_process_s_shards_and_resumes_anywhere(
    tmp_path):
  """About 45 s: six short pods. A sharded job with one replica over two
  processes writes its checkpoint from both, each its own shards, and
  never holds the whole state on one host; that checkpoint resumes bit for
  bit on its own topology, and to rounding sharded on 1x8 and 4x2 and
  replicated on 2x4; a replicated checkpoint resumes sharded."""
  sharded = ['--config.state_layout=sharded', '--config.replica=all']
  _probe(tmp_path, 'straight', 60, 2, 4, *sharded)
  _probe(tmp_path, 'saved', 40, 2, 4, *sharded)
  state = tmp_path / 'saved' / 'checkpoints' / '40' / 'state'
  # Orbax's per-process stores: process 1 wrote its half of each split
  # leaf.
  written = _written_by_process(state)
  # Compressed, about half each: process 1 wrote its half of each split
  # leaf; the whole leaves are few and small.
  assert written[1] > written[0] / 2, written
  want = helpers.final_state(tmp_path / 'straight')
  for name in ('on-1x8', 'on-4x2', 'replicated'):
    shutil.copytree(tmp_path / 'saved', tmp_path / name)
  for name, pod, extra in (('saved', (2, 4),
                            sharded), ('on-1x8', (1, 8),
                                       ('--config.state_layout=sharded',)),
                           ('on-4x2', (4, 2),
                            ('--config.state_layout=sharded',)), ('replicated',
                                                                  (2, 4), ())):
    output = _probe(tmp_path, name, 60, *pod, *extra)
    assert 'resuming at step 40' in output, output
    if name == 'saved':
      assert (helpers.fingerprints(tmp_path / name, 2) == helpers.fingerprints(
          tmp_path / 'straight', 2))
    helpers.assert_trees_close(helpers.final_state(tmp_path / name),
                               want,
                               rtol=1e-5,
                               atol=1e-6)
  # And the other way: a replicated checkpoint, which process 0 alone
  # writes, resumed sharded.
  _probe(tmp_path, 'from-replicated', 40, 2, 4)
  written = _written_by_process(tmp_path / 'from-replicated' / 'checkpoints' /
                                '40' / 'state')
  assert written[0] > 4096 and written.get(1, 0) < 1024, written
  output = _probe(tmp_path, 'from-replicated', 60, 2, 4,
                  '--config.state_layout=sharded')
  assert 'resuming at step 40' in output, output
  helpers.assert_trees_close(helpers.final_state(tmp_path / 'from-replicated'),
                             want,
                             rtol=1e-5,
                             atol=1e-6)


def _last_restore_tiers(workdir) -> list[str]:
  """The restore tier each process of the last attempt noted."""
  attempts = {}
  for path in pathlib.Path(workdir).glob('goodput/*/rank_*.json'):
    ledger = helpers.read_json(path)
    attempts.setdefault(path.parent.name, {})[int(
        path.stem[5:])] = (ledger['started'],
                           ledger.get('notes', {}).get('restore_tier'))
  last = max(attempts.values(), key=lambda a: min(v[0] for v in a.values()))
  return [last[i][1] for i in sorted(last)]


@pytest.mark.timeout(400)
@pytest.mark.parametrize('replica, local_tier', [('process', ['local', 'peer']),
                                                 ('all', ['local', 'local'])])
def test_a_kill_in_a_local_save_restores_each_process_s_part(
    tmp_path, replica, local_tier):
  """About 25 s each: process 1 of a sharded 2x4 job is SIGKILLed halfway
  through writing its local copy of step 40, and the job ends on the bits
  of an undisturbed run. A replica per process: each process's part is
  the whole state, so process 0's copy of step 40 restores both, placed
  through the devices; one replica over both processes: each process
  keeps only its half, no position but process 0's holds step 40, so both
  go back to step 30, each reading its own half."""
  sharded = [
      *PROBE, '--local_processes=2', '--local_devices=4',
      f'--config.replica={replica}', '--config.per_rank_local_dir=True'
  ]
  straight = helpers.run_launcher([*sharded, f'--workdir={tmp_path}/straight'],
                                  timeout=150)
  assert straight.returncode == 0, straight.output
  killed = helpers.run_launcher([
      *sharded, '--config.fail_rank=1', '--config.fail_step=-1',
      '--config.fail_once=True', '--config.kill_in_local_save=40',
      '--max_restarts=1', '--retry_exit_codes=137', '--restart_backoff=0.5',
      f'--workdir={tmp_path}/killed'
  ],
                                timeout=150)
  assert killed.returncode == 0, killed.output
  assert 'probe: sigkill in the local save of step 40' in killed.output
  step = 40 if replica == 'process' else 30
  assert f'resuming at step {step}' in killed.output, killed.output
  if replica == 'process':
    assert "restoring step 40 from process(es) 0's local copy" in (
        killed.output), killed.output
  assert _last_restore_tiers(tmp_path / 'killed') == local_tier
  assert helpers.fingerprints(tmp_path / 'killed', 2) == (helpers.fingerprints(
      tmp_path / 'straight', 2))
  helpers.assert_no_survivors(tmp_path / 'killed')
  # What a local copy holds: a job that fails at step 45 leaves them.
  failed = helpers.run_launcher([
      *sharded[:-1], f'--config.local_checkpoint_dir={tmp_path}/local',
      '--config.fail_rank=1', '--config.fail_step=45',
      f'--workdir={tmp_path}/failed'
  ],
                                timeout=150)
  assert failed.returncode != 0, failed.output
  for process in (0, 1):
    copy, = (tmp_path / 'local').glob(f'*/rank_{process}/step_40/state.npz')
    with np.load(copy) as saved:
      ballast = saved[".params['ballast']"]
    # A replica per process keeps the whole leaf, one over both its half.
    half = 4096 if replica == 'process' else 2048
    assert ballast.shape == (half,), (process, ballast.shape)


def test_the_census_is_exact_through_a_sigkill_with_sharded_state(tmp_path):
  """About 20 s: the fault soak's census job (tests/benchmarks/soak.py) on
  a 2x4 local pod with its state sharded, process 1 SIGKILLed at step 22;
  the job resumes from the local tier and trains every example and
  step exactly once."""
  trial = soak.Trial(0,
                     'sigkill_step',
                     'fixed',
                     target=1,
                     at_step=22,
                     config=('--config.parallelism=shard_map',
                             '--config.state_layout=sharded'))
  row = soak.run_trial(trial, tmp_path)
  assert row['success'], {k: v for k, v in row.items()}
  assert row['census_exact'] and not row['left_behind']
  assert row['attempts'] >= 2, row
  logs = ''.join(
      p.read_text(errors='replace')
      for p in (tmp_path / 'trial-000' / 'logs').rglob('*')
      if p.is_file())
  assert 'state sharded' in logs, logs[-3000:]
