"""The launcher under the real schedulers: a single-node SLURM and mpirun.

Every job is the probe linear regression on 2 processes x 4 emulated CPU
devices, as a 2x4 local pod runs it; the reference is that local pod's
fingerprint. Where a signal must land mid-run, rank 0 pauses for a few
seconds at step 20 (fail_mode=sleep), which changes nothing computed. The
coordinator listens on 127.0.0.1 only (--coordinator_bind_address, with
JAX_COORDINATOR_PORT fixing JAX's port), and so do the SLURM daemons.
"""

import pathlib
import re
import shlex
import subprocess
import sys
import time

import pytest

from runtime.common import exit_codes
from tests import cluster
from tests import helpers
from tests import schedulers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

STEPS = 40
PROBE = [
    f'--config={helpers.PROBE_CONFIG}', '--config.log_every=1',
    '--config.checkpoint_every=10', f'--config.steps={STEPS}'
]
PAUSE = [
    '--config.fail_rank=0', '--config.fail_step=20', '--config.fail_mode=sleep',
    '--config.fail_seconds=6'
]


def _launcher(workdir, port: int, *args) -> list[str]:
  """One task's command: the launcher, finding its place from the cluster."""
  return [
      sys.executable, '-u', '-m', 'launcher', *PROBE, f'--workdir={workdir}',
      '--local_devices=4', f'--coordinator_bind_address=127.0.0.1:{port}', *args
  ]


def _env(port: int) -> dict[str, str]:
  return helpers.launcher_env(JAX_COORDINATOR_PORT=str(port),
                              PYTHONUNBUFFERED='1')


def _last_step(workdir) -> int:
  try:
    return max(
        r['step']
        for r in helpers.read_jsonl(pathlib.Path(workdir) / 'metrics.jsonl'))
  except (OSError, ValueError):
    return 0


@pytest.fixture(scope='module')
def straight(tmp_path_factory) -> str:
  """The fingerprint of a 2x4 local pod trained without interruption."""
  workdir = tmp_path_factory.mktemp('straight')
  result = helpers.run_launcher([
      *PROBE, f'--workdir={workdir}', '--local_processes=2', '--local_devices=4'
  ])
  assert result.returncode == 0, result.output
  fingerprints = helpers.fingerprints(workdir)
  assert fingerprints[0] == fingerprints[1]
  return fingerprints[0]


@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
  instance = schedulers.Slurm(str(tmp_path_factory.mktemp('slurm')))
  instance.start()
  try:
    yield instance
  finally:
    instance.stop()


def _srun(slurm, workdir, port, *args, srun_flags=()) -> subprocess.Popen:
  command = [
      'srun', '-n', '2', '-l', '--chdir',
      str(helpers.REPO), *srun_flags, *_launcher(workdir, port, *args)
  ]
  return subprocess.Popen(command,
                          env={
                              **_env(port),
                              **{
                                  'SLURM_CONF': slurm.conf
                              }
                          },
                          stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True,
                          start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float) -> str:
  try:
    out, _ = proc.communicate(timeout=timeout)
  finally:
    helpers.kill_group(proc)
  return out


def _assert_nothing_left(port: int, slurm=None) -> None:
  """No task of the job survives (each carries its port in its environment),
  and SLURM holds no job."""
  assert helpers.wait_for(
      lambda: not helpers.processes_with_env(f'JAX_COORDINATOR_PORT={port}'),
      30)
  if slurm is not None:
    assert helpers.wait_for(
        lambda: not slurm.run(['squeue', '-h'], check=False).stdout.strip(), 30)


def test_srun_trains_as_a_local_pod_does(slurm, straight, tmp_path):
  port = cluster.free_port()
  proc = _srun(slurm, tmp_path, port)
  out = _finish(proc, 240)
  assert proc.returncode == 0, out
  assert helpers.fingerprints(tmp_path) == [straight] * 2
  summary = helpers.read_json(tmp_path / 'summary.json')
  assert summary['process_count'] == 2 and summary['device_count'] == 8
  # The coordinator JAX found through SLURM listens on loopback only.
  assert f'Starting JAX distributed service on 127.0.0.1:{port}' in out, out
  _assert_nothing_left(port, slurm)


def _raise_on_rank_1(slurm, workdir, srun_flags=()) -> tuple[int, str]:
  port = cluster.free_port()
  proc = _srun(slurm,
               workdir,
               port,
               '--config.steps=1000000',
               '--config.fail_rank=1',
               '--config.fail_step=3',
               '--config.fail_mode=raise',
               srun_flags=srun_flags)
  out = _finish(proc, 240)
  _assert_nothing_left(port, slurm)
  return proc.returncode, out


def test_a_task_that_raises_is_named_and_the_other_exits_10(slurm, tmp_path):
  code, out = _raise_on_rank_1(slurm, tmp_path)
  assert 'task 1: Exited with exit code 1' in out, out
  assert f'task 0: Exited with exit code {exit_codes.PEER_FAILED}' in out, out
  assert 'rank 1 on' in out and 'failed first: exit 1' in out, out
  # srun exits with its tasks' highest code: the consequence's 10, not the
  # cause's 1, which srun's own line and the log name.
  assert code == exit_codes.PEER_FAILED, out


def test_kill_on_bad_exit_ends_the_step_as_well(slurm, tmp_path):
  # SLURM would stop the other task once one fails; podrun's broadcast ends
  # it first (the failing task waits for its acknowledgement before it
  # exits), so the other task still exits 10, and nothing is left.
  code, out = _raise_on_rank_1(slurm, tmp_path, ('--kill-on-bad-exit=1',))
  assert 'task 1: Exited with exit code 1' in out, out
  assert f'task 0: Exited with exit code {exit_codes.PEER_FAILED}' in out, out
  assert code == exit_codes.PEER_FAILED, out


def test_scancel_signal_term_is_a_preemption(slurm, tmp_path):
  port = cluster.free_port()
  proc = _srun(slurm, tmp_path, port, *PAUSE)
  try:
    assert helpers.wait_for(
        lambda: _last_step(tmp_path) >= 15 or proc.poll() is not None, 180)
    assert proc.poll() is None, _finish(proc, 10)
    job_id = slurm.run(['squeue', '-h', '-o', '%i']).stdout.split()[0]
    slurm.run(['scancel', '--signal=TERM', job_id])
    out = _finish(proc, 120)
  finally:
    helpers.kill_group(proc)
  assert proc.returncode == exit_codes.PREEMPTED, out
  assert out.count('preempted: saved the checkpoint of step') == 2, out
  _assert_nothing_left(port, slurm)


def test_kill_wait_is_the_time_a_preemption_save_has(slurm, tmp_path):
  # Rank 0's input sleeps 60 s at step 20, so no step boundary comes and
  # no preemption save can happen: scancel's SIGTERM is followed by SIGKILL
  # after KillWait (2 s here, 30 s by default), and the checkpoints are the
  # ones from before.
  slurm.set_kill_wait(2)
  port = cluster.free_port()
  try:
    proc = _srun(slurm, tmp_path, port, '--config.fail_rank=0',
                 '--config.fail_step=20', '--config.fail_mode=sleep',
                 '--config.fail_seconds=60')
    assert helpers.wait_for(
        lambda: _last_step(tmp_path) >= 19 or proc.poll() is not None, 180)
    assert proc.poll() is None, _finish(proc, 10)
    job_id = slurm.run(['squeue', '-h', '-o', '%i']).stdout.split()[0]
    cancelled = time.monotonic()
    slurm.run(['scancel', job_id])
    out = _finish(proc, 120)
    took = time.monotonic() - cancelled
  finally:
    slurm.set_kill_wait(30)
  assert 'preempted: saved the checkpoint' not in out, out
  # Well under the sleep and the default KillWait: SLURM's SIGKILL ended it.
  assert took < 20, (took, out)
  assert sorted(
      int(p.name)
      for p in (tmp_path / 'checkpoints').iterdir()
      if p.name.isdigit()) == [10, 20]
  _assert_nothing_left(port, slurm)


def test_a_sigkilled_task_is_named_and_a_rerun_resumes_locally(
    slurm, straight, tmp_path):
  # Only the local tier between the start and the end: a copy every 10
  # steps, rank 1 SIGKILLed while loading step 26's batch. The test then
  # runs the same srun again, as a requeue would.
  tiers = [
      '--config.checkpoint_every=1000', '--config.local_checkpoint_every=10',
      '--heartbeat_timeout=3'
  ]
  port = cluster.free_port()
  proc = _srun(slurm, tmp_path, port, *tiers, '--config.fail_rank=1',
               '--config.fail_step=25', '--config.fail_mode=sigkill')
  out = _finish(proc, 240)
  _assert_nothing_left(port, slurm)
  assert 'task 1: Killed' in out, out
  assert re.search(r'rank 1 on \S+ (was lost|failed first)', out), out
  port = cluster.free_port()
  proc = _srun(slurm, tmp_path, port, *tiers)
  again = _finish(proc, 240)
  assert proc.returncode == 0, again
  _assert_nothing_left(port, slurm)
  assert helpers.fingerprints(tmp_path) == [straight] * 2
  ledgers = _last_attempt_ledgers(tmp_path)
  assert [(ledgers[r]['notes']['restore_tier'],
           ledgers[r]['notes']['restore_step'])
          for r in (0, 1)] == [('local', 20)] * 2


def _last_attempt_ledgers(workdir) -> dict[int, dict]:
  """{rank: goodput ledger} of the attempt that started last."""
  attempts = {}
  for path in pathlib.Path(workdir).glob('goodput/*/rank_*.json'):
    attempts.setdefault(path.parent.name, {})[int(
        path.stem[len('rank_'):])] = helpers.read_json(path)
  return max(attempts.values(), key=lambda a: a[0]['started'])


def _batch_script(workdir, port: int, *args: str, srun: str = 'srun -l') -> str:
  command = shlex.join(_launcher(workdir, port, *PAUSE, *args))
  return ('#!/bin/bash\n'
          f'cd {shlex.quote(str(helpers.REPO))}\n'
          f'exec {srun} {command}\n')


def test_a_requeued_batch_job_resumes_exactly(slurm, straight, tmp_path):
  port = cluster.free_port()
  script = tmp_path / 'job.sh'
  script.write_text(_batch_script(tmp_path / 'work', port))
  log = tmp_path / 'job.log'
  lease = tmp_path / 'work' / '.podrun_lease.json'
  job_id = slurm.run([
      'sbatch', '--parsable', '--requeue', '-n', '2', '--open-mode=append',
      f'--output={log}',
      str(script)
  ],
                     env=_env(port)).stdout.strip()
  try:
    assert helpers.wait_for(
        lambda: _last_step(tmp_path / 'work') >= 15 or slurm.job_state(job_id)
        is None, 180), slurm.logs()
    # SLURM's job id names the lease, so the requeued job takes it over.
    assert helpers.read_json(lease)['job_id'] == f'slurm-{job_id}'
    slurm.run(['scontrol', 'requeue', job_id])
    # A requeued job waits on a begin time of about two minutes; a user (or
    # this test) may release it at once.
    assert helpers.wait_for(lambda: slurm.job_state(job_id) == 'PENDING',
                            120), log.read_text()
    slurm.run(['scontrol', 'update', f'JobId={job_id}', 'StartTime=now'])
    assert helpers.wait_for(lambda: slurm.job_state(job_id) is None,
                            240), (log.read_text())
  finally:
    slurm.run(['scancel', job_id], check=False)
  out = log.read_text()
  # Both tasks saved the same step and exited 75; the requeued job restored
  # that step: from each task's local copy of it, on the same nodes, or
  # from the persistent tier.
  saved = [
      l.split('step ')[-1]
      for l in out.splitlines()
      if 'preempted: saved the checkpoint of step' in l
  ]
  assert len(saved) == 2 and saved[0] == saved[1], out
  requeued = out.partition('Exited with exit code 75')[2]
  step = saved[0].split()[0]
  assert (f'(step {step})' in requeued or
          f'restored step {step} from' in requeued), out
  assert helpers.fingerprints(tmp_path / 'work') == [straight] * 2
  steps = [
      r['step'] for r in helpers.read_jsonl(tmp_path / 'work' / 'metrics.jsonl')
  ]
  assert steps == list(range(1, STEPS + 1))
  assert not lease.exists()  # Released at the end of the resumed run.
  _assert_nothing_left(port, slurm)


def _requeue_when_past(slurm, job_id: str, workdir, step: int, *updates:
                       str) -> None:
  """Requeues the job once it trained `step` steps, applies `updates`
  (scontrol update fields) while it is pending, releases it and waits for
  its end."""
  assert helpers.wait_for(
      lambda: _last_step(workdir) >= step or slurm.job_state(job_id) is None,
      180), slurm.logs()
  slurm.run(['scontrol', 'requeue', job_id])
  # A requeued job waits on a begin time of about two minutes; a user (or
  # this test) may release it at once.
  assert helpers.wait_for(lambda: slurm.job_state(job_id) == 'PENDING', 120)
  slurm.run(
      ['scontrol', 'update', f'JobId={job_id}', *updates, 'StartTime=now'])
  assert helpers.wait_for(lambda: slurm.job_state(job_id) is None, 240)


def test_a_job_requeued_with_fewer_tasks_trains_the_same_batch(slurm, tmp_path):
  """About 30-45 s: two SLURM jobs of 4 and 2 tasks, each starting JAX in
  every task."""
  # 4 tasks x 2 devices, requeued, then 2 tasks x 2 devices: the same 256
  # examples a step, 2 microbatches of the first attempt's 32 a device.
  port = cluster.free_port()
  script = tmp_path / 'job.sh'
  # A requeued batch job keeps SLURM_NTASKS of its submission (4); its
  # allocation's task count is in SLURM_TASKS_PER_NODE (one node here).
  script.write_text(
      _batch_script(tmp_path / 'work',
                    port,
                    '--local_devices=2',
                    srun='srun -l -n "${SLURM_TASKS_PER_NODE%%(*}"'))
  log = tmp_path / 'job.log'
  job_id = slurm.run([
      'sbatch', '--parsable', '--requeue', '-n', '4', '--overcommit',
      '--open-mode=append', f'--output={log}',
      str(script)
  ],
                     env=_env(port)).stdout.strip()
  try:
    _requeue_when_past(slurm, job_id, tmp_path / 'work', 15, 'NumTasks=2')
  finally:
    slurm.run(['scancel', job_id], check=False)
  out = log.read_text()
  first, _, requeued = out.partition('Exited with exit code 75')
  assert 'on process 0 of 4' in first and requeued, out
  assert ('on process 0 of 2, 2 local x 2 processes' in requeued and
          '2 microbatch(es) of 32 example(s) per device' in requeued), out
  rows = helpers.read_jsonl(tmp_path / 'work' / 'metrics.jsonl')
  assert [r['step'] for r in rows] == list(range(1, STEPS + 1))
  assert {(r['num_processes'], r['microbatches']) for r in rows} == {(4, 1),
                                                                     (2, 2)}
  reference = tmp_path / 'reference'
  result = helpers.run_launcher([*PROBE, f'--workdir={reference}'])
  assert result.returncode == 0, result.output
  helpers.assert_trees_close(helpers.final_state(tmp_path / 'work')['params'],
                             helpers.final_state(reference)['params'],
                             rtol=1e-5,
                             atol=1e-6)
  _assert_nothing_left(port, slurm)


def _mpirun(workdir, port: int, *args) -> subprocess.Popen:
  schedulers.require(schedulers.MPI_BINARIES)
  command = [
      'mpirun', '--allow-run-as-root', '--oversubscribe', '-np', '2', '--mca',
      'oob_tcp_if_include', 'lo', '--mca', 'btl_tcp_if_include', 'lo', '-x',
      'JAX_COORDINATOR_PORT', '-x', 'PYTHONPATH',
      *_launcher(workdir, port, *args)
  ]
  return subprocess.Popen(command,
                          cwd=helpers.REPO,
                          env=_env(port),
                          stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True,
                          start_new_session=True)


@pytest.mark.timeout(240)
def test_mpirun_trains_as_a_local_pod_does(straight, tmp_path):
  port = cluster.free_port()
  proc = _mpirun(tmp_path, port)
  out = _finish(proc, 200)
  assert proc.returncode == 0, out
  assert helpers.fingerprints(tmp_path) == [straight] * 2
  _assert_nothing_left(port)


@pytest.mark.timeout(300)
def test_mpirun_with_a_killed_process_resumes_from_the_local_tier(
    straight, tmp_path):
  tiers = [
      '--config.checkpoint_every=1000', '--config.local_checkpoint_every=10',
      '--heartbeat_timeout=3'
  ]
  port = cluster.free_port()
  proc = _mpirun(tmp_path, port, *tiers, '--config.fail_rank=1',
                 '--config.fail_step=25', '--config.fail_mode=sigkill')
  out = _finish(proc, 200)
  # mpirun names the process that died, stops the other, and exits 137.
  assert proc.returncode == 128 + 9, out
  assert 'process rank 1 with PID' in out and 'signal 9 (Killed)' in out, out
  _assert_nothing_left(port)
  port = cluster.free_port()
  proc = _mpirun(tmp_path, port, *tiers)
  again = _finish(proc, 200)
  assert proc.returncode == 0, again
  _assert_nothing_left(port)
  assert helpers.fingerprints(tmp_path) == [straight] * 2
  ledgers = _last_attempt_ledgers(tmp_path)
  assert [(ledgers[r]['notes']['restore_tier'],
           ledgers[r]['notes']['restore_step'])
          for r in (0, 1)] == [('local', 20)] * 2
