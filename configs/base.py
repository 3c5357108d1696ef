"""Fields every job config has; the other configs start from `get_config()`."""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
  config = config_dict.ConfigDict()
  # 'package.module:function', called as function(config, workdir).
  config.workload = config_dict.placeholder(str)
  config.seed = 0
  config.steps = 100
  config.global_batch_size = 256
  config.log_every = 10
  config.learning_rate = 0.1
  # Reshuffle the data every epoch (see runtime/data.py).
  config.shuffle = True
  # Dispatched steps allowed to be unfinished; None: 1 on CPU, 2 elsewhere.
  config.max_steps_in_flight = config_dict.placeholder(int)
  # 'pmap', or 'shard_map' (jit + jax.shard_map over a mesh of all devices):
  # the same step, the same pmean (runtime/parallelism.py).
  config.parallelism = 'pmap'
  # Batches read and copied to the devices ahead of the step that needs them.
  config.prefetch = 2

  # Checkpoints (runtime/checkpoint.py): every checkpoint_every steps (0: only
  # at the end and on preemption), the newest keep_checkpoints kept, written
  # while training goes on. checkpoint_dir '' means WORKDIR/checkpoints; on a
  # multi-host job it must be storage every host shares (e.g. gs://...).
  config.checkpointing = True
  config.checkpoint_every = 1000
  config.keep_checkpoints = 3
  config.checkpoint_dir = ''
  config.async_checkpointing = True
  # Resume from the latest checkpoint in checkpoint_dir; False starts afresh
  # and refuses a directory that already holds checkpoints.
  config.restore = True
  # Config fields besides checkpoint.RUN_CONTROL_FIELDS that may differ from
  # the checkpoint's when resuming.
  config.restore_may_change = ()
  # Exit codes besides 75 (preempted) that the launcher's --max_restarts
  # retries; added to --retry_exit_codes.
  config.retry_exit_codes = ()

  # The pod the job expects; None accepts whatever is there.
  config.topology = config_dict.ConfigDict()
  config.topology.num_processes = config_dict.placeholder(int)
  config.topology.local_devices = config_dict.placeholder(int)
  # 'cpu', 'gpu' or 'tpu'.
  config.topology.platform = config_dict.placeholder(str)
  # A Cloud TPU slice such as 'v4-32': implies the platform, the processes
  # and the devices per process (launcher/tpu_accelerators.py), and
  # scripts/launch_tpu_pod.sh checks the pod against it before launching.
  config.topology.accelerator_type = config_dict.placeholder(str)
  return config
