"""A GPU host without a GPU: a fake nvidia-smi (tests/fake_nvidia) lists 8
H200s, and each process of every deployment is given its own
(launcher/common/gpus.py, launcher/process/gpu_host.py)."""

import os
import pathlib
import subprocess

import pytest

from launcher.common import cluster
from launcher.common import gpus
from launcher.process import distributed
from launcher.process import gpu_host
from tests import helpers

pytestmark = pytest.mark.unit

FAKE = pathlib.Path(__file__).parent / 'fake_nvidia' / 'nvidia-smi'


def _run_fake(count=8, used_mib=0):
  env = {
      **os.environ, 'FAKE_GPUS': str(count),
      'FAKE_GPU_USED_MIB': str(used_mib)
  }

  def run(command):
    done = subprocess.run([str(FAKE), *command[1:]],
                          capture_output=True,
                          text=True,
                          env=env,
                          check=False)
    return done.stdout if done.returncode == 0 else None

  return run


def test_the_host_s_gpus_and_each_process_s_share(tmp_path):
  found = gpus.find({}, _run_fake())
  assert [g.index for g in found] == list(range(8))
  assert found[3].uuid.startswith('GPU-00000003') and found[3].name == (
      'NVIDIA H200')
  assert [s.visible for s in gpus.split(found, 8)] == [str(i) for i in range(8)]
  assert [s.visible for s in gpus.split(found, 2)] == ['0,1,2,3', '4,5,6,7']
  assert gpus.is_hopper(found)
  # Narrowed as CUDA_VISIBLE_DEVICES says, by index or UUID.
  assert [
      g.index for g in gpus.find({'CUDA_VISIBLE_DEVICES': '6,2'}, _run_fake())
  ] == [6, 2]
  by_uuid = gpus.find({'CUDA_VISIBLE_DEVICES': 'GPU-00000005'}, _run_fake())
  assert [(g.index, g.token) for g in by_uuid] == [(5, 'GPU-00000005')]
  assert gpus.find({'CUDA_VISIBLE_DEVICES': ''}, _run_fake()) == []
  # Without nvidia-smi: the driver's directory.
  assert gpus.find({}, lambda c: None, proc_root=str(tmp_path / 'no')) == []


def test_the_driver_s_directory_when_nvidia_smi_is_missing(tmp_path):
  for bus in ('0000:3b:00.0', '0000:18:00.0', 'not-a-gpu'):
    (tmp_path / bus).mkdir()
  found = gpus.find({}, lambda c: None, proc_root=str(tmp_path))
  assert [(g.index, g.bus_id) for g in found] == [(0, '0000:18:00.0'),
                                                  (1, '0000:3b:00.0')]


@pytest.mark.parametrize('processes, said', [
    (16, 'more processes than GPUs would put two on one GPU'),
    (3, '3 process(es) do not divide 8 GPU(s) evenly'),
])
def test_two_processes_on_one_gpu_are_refused_with_what_works(processes, said):
  with pytest.raises(gpus.GpuLayoutError) as refused:
    gpus.split(gpus.find({}, _run_fake()), processes)
  assert said in str(refused.value)
  assert 'Use --local_processes=1 or 2 or 4 or 8' in str(refused.value)
  assert refused.value.exit_code == 2


@pytest.mark.parametrize(
    'env, ids',
    [
        # One task a node driving the node's four GPUs: all four, not
        # SLURM_LOCALID's one (JAX 16788).
        ({
            'SLURM_LOCALID': '0',
            'CUDA_VISIBLE_DEVICES': '0,1,2,3'
        }, [0, 1, 2, 3]),
        # --gpus-per-task=1 on a partial node: task 1 sees its one GPU as
        # ordinal 0 (SLURM_LOCALID=1 would be an invalid ordinal, JAX 23452).
        ({
            'SLURM_LOCALID': '1',
            'SLURM_STEP_GPUS': '2,3',
            'CUDA_VISIBLE_DEVICES': '3'
        }, [0]),
        # The step's GPUs by host ordinal where nothing narrows them.
        ({
            'SLURM_LOCALID': '1',
            'SLURM_STEP_GPUS': '2,3',
            'SLURM_NTASKS_PER_NODE': '2'
        }, [3]),
        ({
            'SLURM_LOCALID': '0',
            'SLURM_STEP_GPUS': '4,5,6,7',
            'SLURM_TASKS_PER_NODE': '2(x2)',
            'SLURM_NODEID': '1'
        }, [4, 5]),
        ({}, None),
    ])
def test_slurm_layouts_give_the_right_ordinals(env, ids):
  assert gpus.local_device_ids(env) == ids


def test_open_mpi_5_is_detected_and_needs_a_coordinator():
  env = {
      'OMPI_COMM_WORLD_RANK': '3',
      'OMPI_COMM_WORLD_SIZE': '4',
      'OMPI_COMM_WORLD_LOCAL_RANK': '1',
      'PMIX_NAMESPACE': 'prterun-node0-1234@1',
      'PMIX_RANK': '3'
  }
  assert cluster.detect(env) == 'open_mpi_5'
  assert cluster.detect({**env, 'OMPI_MCA_orte_hnp_uri': 'x'}) == 'open_mpi'
  told = cluster.explicit_options(env)
  assert told['process_id'] == (3, 'OMPI_COMM_WORLD_RANK')
  assert told['num_processes'] == (4, 'OMPI_COMM_WORLD_SIZE')
  flags = distributed.CoordinatorFlags(coordinator_address=None,
                                       num_processes=4,
                                       process_id=3)
  with pytest.raises(distributed.DistributedInitError,
                     match='Open MPI 5 gives .* Pass --coordinator_address'):
    distributed.plan(flags, env=env)
  chosen = distributed.plan(
      distributed.CoordinatorFlags(coordinator_address='node0:8476',
                                   num_processes=4,
                                   process_id=3), env)
  assert chosen.mode == distributed.EXPLICIT


def test_the_memory_fraction_and_the_preset_are_set_and_said(tmp_path):
  env = {'CUDA_VISIBLE_DEVICES': '4,5', 'XLA_PYTHON_CLIENT_MEM_FRACTION': '.5'}
  setup = gpu_host.prepare(gpu_host.GpuPolicy(memory_fraction=0.9), env,
                           _run_fake())
  assert setup is not None
  assert [g.index for g in setup.gpus] == [4, 5]
  assert setup.local_device_ids == [0, 1]
  # The old name beside the new one makes JAX raise: it is gone.
  assert env['XLA_CLIENT_MEM_FRACTION'] == '0.9'
  assert 'XLA_PYTHON_CLIENT_MEM_FRACTION' not in env
  assert env['XLA_FLAGS'] == '--xla_gpu_enable_latency_hiding_scheduler=true'
  assert env['CUDA_DEVICE_MAX_CONNECTIONS'] == '1'
  assert 'preallocates 90% of each' in setup.line
  assert 'GPU 4 (GPU-00000004' in setup.line
  # What the user set wins, and the preset can be dropped.
  env = {
      'XLA_FLAGS': '--xla_gpu_enable_latency_hiding_scheduler=false',
      'CUDA_DEVICE_MAX_CONNECTIONS': '8'
  }
  gpu_host.prepare(gpu_host.GpuPolicy(), env, _run_fake())
  assert env['XLA_FLAGS'] == '--xla_gpu_enable_latency_hiding_scheduler=false'
  assert env['CUDA_DEVICE_MAX_CONNECTIONS'] == '8'
  env = {}
  setup = gpu_host.prepare(gpu_host.GpuPolicy(preset=False), env, _run_fake())
  assert env == {} and setup.fraction == 0.75
  assert gpu_host.prepare(gpu_host.GpuPolicy(), {},
                          lambda c: None,
                          proc_root='/nonexistent') is None


def test_a_restart_waits_bounded_for_the_gpu_s_memory():
  # 100 GiB of 140 still held by a killed process: 75 % is not free.
  slept = []
  clock = iter(range(100)).__next__
  waited = gpu_host.wait_for_memory(gpus.find({}, _run_fake())[:1],
                                    0.75,
                                    timeout_s=5,
                                    run=_run_fake(used_mib=100_000),
                                    sleep=slept.append,
                                    clock=lambda: float(clock()))
  assert waited >= 5 and slept
  # Free at once: no wait.
  slept = []
  assert gpu_host.wait_for_memory(gpus.find({}, _run_fake())[:1],
                                  0.75,
                                  5,
                                  _run_fake(),
                                  sleep=slept.append,
                                  clock=lambda: 0.0) == 0.0
  assert not slept
