"""Which processes-tier tests the oldest pair (Python 3.11, JAX 0.10.2) runs.

CI runs the whole suite on the newest pair and, on the oldest, the quick tier
(`unit` and `devices`, every version-dependent surface in one process) plus
the processes-tier tests named here: each is a place where the range of JAX,
jaxlib, orbax, optax or Flax that pyproject.toml allows could behave
differently across processes. tests/conftest.py marks them `versions`, so the
oldest pair's selection is `-m "not processes or versions"`; what it leaves
out exercises the launcher's own supervision (signals, timers, the fake
gcloud, the schedulers' plumbing), which does not import JAX, or repeats a
path named here with other faults.

Entries are `module.py` (every test in it) or `module.py::test_name` (every
parametrisation of it); tests/test_pairs.py checks that each names a test
that exists.
"""

VERSION_DEPENDENT = {
    # One multi-process run of each deployment kind.
    'test_local_pod.py::test_pods_agree_with_one_process_and_with_one_device':
        'a local pod: jax.distributed on 127.0.0.1 and gloo collectives',
    'test_multihost.py':
        'processes started by hand: initialize with explicit coordinator flags',
    'test_schedulers.py::test_srun_trains_as_a_local_pod_does':
        "SLURM: JAX's own detection of the srun environment",
    'test_schedulers.py::test_mpirun_trains_as_a_local_pod_does':
        "Open MPI: JAX's own detection of the mpirun environment",
    'test_launch_tpu_pod.py::test_runs_the_job_on_every_emulated_worker':
        'a TPU pod: the per-worker environment that initialize reads',
    'test_tpu_fleet.py::test_two_slices_form_one_job_that_trains_as_a_four_process_pod':
        'TPU slices: the multislice environment of one job',
    'test_elastic_processes.py::test_a_lost_process_shrinks_the_pod_and_it_grows_back':
        'an elastic pod: initialize again with another process count',
    'test_cluster_env_processes.py::test_srun_style_job_is_detected_by_jax':
        "jax._src.clusters' detection, which moves between versions",
    # jax.distributed.initialize and the coordination client.
    'test_agreement_processes.py::test_processes_started_by_hand_that_differ_stop_before_step_1':
        "the coordination service's key-value store and barriers",
    'test_cluster_supervision.py::test_a_sigkilled_rank_is_named_as_lost':
        "the coordination service's view of a process that is gone",
    'test_cluster_supervision.py::test_a_rank_that_never_joins_is_named':
        "initialize's timeout and what it raises",
    'test_cluster_supervision.py::test_a_stale_lease_is_taken_over':
        'the lease handshake through the key-value store',
    'test_gang.py::test_nobody_listens_at_the_coordinator_address':
        "initialize's error when the coordinator is absent",
    'test_gang.py::test_topology_mismatch_found_after_initialisation':
        'the device counts initialize reports',
    # Checkpoint formats and restore across topologies (orbax).
    'test_preemption.py::test_resume_is_exact_on_2x4':
        "orbax's save and restore across processes, bit for bit",
    'test_preemption.py::test_a_1x8_checkpoint_restores_on_2x4':
        "orbax's restore onto another topology",
    'test_preemption.py::test_sigkill_during_a_save_falls_back_to_the_last_complete_checkpoint':
        "orbax's temporary directories and what counts as complete",
    'test_recovery.py::test_a_sigkilled_process_0_resumes_from_the_local_tier':
        'the local tier: arrays written and read without orbax',
    'test_recovery.py::test_a_1x8_local_copy_restores_on_2x4':
        'the local tier restored onto another topology',
    'test_recovery.py::test_a_replaced_host_restores_from_a_peer':
        "a peer's copy sent by multihost_utils.broadcast_one_to_all",
    'test_microbatches_processes.py::test_a_2x4_checkpoint_resumes_on_3x2_and_on_1x8_with_a_limit':
        'a checkpoint resumed on 3x2 and on 1x8 with microbatches',
    'test_buckets.py::test_a_sigkill_restores_locally_with_the_persistent_tier_in_the_bucket':
        "orbax's tensorstore writes to gs://",
    # pmap against jit(shard_map); optax and Flax across processes.
    'test_parallelism_processes.py':
        'pmap (on shard_map since 0.10) against jit(shard_map) on 2x4',
    'test_mnist_cnn_processes.py::test_2x4_matches_1x8':
        "Flax's modules, BatchNorm's state and optax's state on 2x4",
    'test_evaluation_processes.py':
        'evaluation gathered across processes',
    'test_integrity_processes.py':
        'per-device arrays of one process checked across processes',
}


def is_version_dependent(module: str, test: str) -> bool:
  """Whether the test `test` (a function name, parametrisation dropped) of
  the module file `module` (a base name) is named in VERSION_DEPENDENT."""
  return module in VERSION_DEPENDENT or (f'{module}::{test}'
                                         in VERSION_DEPENDENT)
