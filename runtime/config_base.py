"""Every field the runtime reads, with its default; every config starts
from `get_config()` and changes a few:

  from runtime import config_base

  def get_config():
    config = config_base.get_config()
    config.workload = 'my_model:train_and_evaluate'
    return config

It lives under podrun's own package name, so that a project's own `configs`
(Flax's examples keep theirs in configs/default.py) is the project's.

The sections `model`, `optimizer` and `data`, with `workload`, `seed` and
`global_batch_size`, decide what a run computes: a resumed run must agree with
its checkpoint on them (runtime/checkpoints/checkpoint_meta.py
TRAJECTORY_SECTIONS). A workload puts its own fields there. Every other field
only steers the run and may change between a run and its resumption.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
  config = config_dict.ConfigDict()
  _add_trajectory(config)
  _add_run_control(config)
  _add_checkpoints(config)
  _add_topology(config)
  return config


def _add_trajectory(config: config_dict.ConfigDict) -> None:
  """What the run computes."""
  # 'package.module:function', called as function(config, workdir).
  config.workload = config_dict.placeholder(str)
  # The run's one seed: the data order and the step's random keys.
  config.seed = 0
  # Examples per step, over every device of every process.
  config.global_batch_size = 256
  config.model = config_dict.ConfigDict()
  config.optimizer = config_dict.ConfigDict()
  # The built-in workloads' optimizers read it; a workload of one's own reads
  # it where it builds its optimizer.
  config.optimizer.learning_rate = 0.1
  config.data = config_dict.ConfigDict()
  # Reshuffle the data every epoch (see runtime/data.py).
  config.data.shuffle = True
  # Keep an in-memory data set (a runtime.ArraySource) on every device and
  # gather each call's batch there: only the example ids cross from the
  # host. For small data sets whose steps take a few milliseconds on an
  # accelerator, where placing each batch is the host's bound; it costs the
  # arrays' size on every device (refused over half a device's memory).
  # Unset: on an accelerator, when the data set fits in a quarter of a
  # device's memory (runtime/device_data.py); on a CPU, never.
  config.data.on_device = config_dict.placeholder(bool)
  # Processes that read each batch's records (runtime/readers.py), for a
  # source whose records take milliseconds of host work each (decoding,
  # augmenting); the same batches as a read in this process. The source must
  # pickle. 0: this process reads them. -1: auto: the first 3 reads in
  # this process, timed; where a step's records took 20 ms or more, enough
  # workers to bring it to 20 ms, within this process's spare cores.
  config.data.workers = 0


def _add_run_control(config: config_dict.ConfigDict) -> None:
  """How the run goes."""
  # The step training ends at, counted over every attempt: a resumed run
  # goes on from its checkpoint to this step.
  config.steps = 100
  # A step line, metrics.jsonl and TensorBoard every log_every steps, each
  # the mean of the steps since the one before.
  config.log_every = 10
  # Evaluate every eval_every steps (0: only at the end); only workloads that
  # evaluate read it.
  config.eval_every = 0
  # Examples per evaluation step over every device (runtime.evaluate).
  config.eval_batch_size = 1024
  # Calls of the step allowed to be unfinished; None: 1 on CPU, 2 elsewhere.
  config.max_steps_in_flight = config_dict.placeholder(int)
  # The TFLOP/s per device that MFU is taken against: a ceiling measured on
  # the machine (a large bf16 matmul); None: the device kind's datasheet
  # figure (runtime/flops.py), said on the first step line.
  config.peak_tflops = config_dict.placeholder(float)
  # Steps one call of the step runs (runtime/dispatch.py), over as many
  # batches placed at once: the same updates and data order as one per call.
  # Every cadence in steps must then be a multiple of it. 0 is auto: 1 on
  # a CPU; on an accelerator, after 20 steps one per call, enough for a
  # call of about 40 ms when a step takes under 5 ms, with at most 24 MiB
  # of batch a call on each host, dividing every cadence; it then looks
  # again every 10 calls and grows while the host's share of a call is over
  # 10 % (docs/running.md).
  config.steps_per_dispatch = 0
  # 'pmap', or 'shard_map' (jit + jax.shard_map over a mesh of all devices):
  # the same step, the same pmean (runtime/parallelism/). '' (the default):
  # pmap, or shard_map where config.state_layout is 'sharded', which pmap
  # cannot hold.
  config.parallelism = ''
  # The name of the axis the step maps over every device, which the model's
  # own collectives use: lax.pmean(x, NAME), Flax's nn.BatchNorm(
  # axis_name=NAME). Flax's examples call it 'batch'. A sharded state's step
  # keeps its own axes.
  config.axis_name = 'devices'
  # Where the parameters and the optimiser state live: 'replicated', whole
  # on every device, or 'sharded', each leaf split over the devices of a
  # replica (runtime/parallelism/state_layout.py): replica 'process' (one
  # per process), 'slice' (one per TPU slice) or 'all' (every device). The
  # batch is split over every device either way, so a step computes the same
  # to float rounding. 'sharded' runs under shard_map (chosen where
  # parallelism is left '', refused under 'pmap'); an elastic job needs
  # replica 'process', so that a lost process takes its replica whole.
  config.state_layout = 'replicated'
  # With 'sharded', the devices that hold one whole copy of the state:
  # 'process', 'slice' or 'all'.
  config.replica = 'process'
  # With 'sharded': the dimension to split a leaf along, where the rule
  # (its largest dimension that the replica's devices divide) will not do,
  # 'PATTERN=DIM,...' with DIM a number or 'whole'; a pattern names a leaf
  # by its path or the path's end, 'embed/embedding=1,out/*=whole'. Wins
  # over Task.shard_dims.
  config.shard_dims = ''
  # Examples per device in one forward and backward pass (0: no limit),
  # passes per device (0: as few as the limit allows), or the examples of
  # one pass exactly (0: chosen from the other two). Beyond the limit the
  # step accumulates gradients over microbatches, and a global batch that
  # does not divide over the devices is padded with groups that never count
  # (runtime/parallelism/microbatches.py), unless the loss has a collective
  # over the batch axis, which padding would enter (runtime/batch_layout.py).
  # None changes what a step computes, only how, except statistics over a
  # pass (BatchNorm's), which microbatch_size keeps the same on any topology
  # where they are over one device's pass (not with axis_name): a run may
  # resume with others. Left at 0, an elastic job keeps its first attempt's
  # pass size.
  config.device_batch_limit = 0
  # Passes per device in one step (0: as few as device_batch_limit allows).
  config.microbatches = 0
  # The examples of one pass exactly (0: chosen from the other two).
  config.microbatch_size = 0
  # Batches read and copied to the devices ahead of the step that needs them.
  config.prefetch = 2
  # Every integrity_every steps, each device's copy of the parameters is
  # checked against every other's (runtime/integrity.py); 0: never.
  config.integrity_every = 100
  # TensorBoard event files in WORKDIR/tensorboard besides metrics.jsonl.
  config.tensorboard = True
  # Put before the names of the step's own metrics (loss, the loss_fn's) and
  # the learning rate in metrics.jsonl, TensorBoard and the step lines:
  # 'train_' writes train_loss, as Flax's examples do. Evaluation's are
  # eval_* either way; podrun's speed fields keep their names.
  config.metrics_prefix = ''
  # A profiler trace of steps start_step + 1 .. start_step + num_steps into
  # WORKDIR/tensorboard (0 steps: none).
  config.profile = config_dict.ConfigDict()
  # The step after which the trace starts.
  config.profile.start_step = 10
  # Steps traced (0: no trace).
  config.profile.num_steps = 0


def _add_checkpoints(config: config_dict.ConfigDict) -> None:
  """Saving, resuming, restarting."""
  # Checkpoints (runtime/checkpoints/checkpoint.py): every checkpoint_every
  # steps (0: only at the end and on preemption), the newest keep_checkpoints
  # kept, written while training goes on. checkpoint_dir '' means
  # WORKDIR/checkpoints; on a multi-host job it must be storage every host
  # shares (e.g. gs://...).
  config.checkpointing = True
  # A persistent save every this many steps (0: only at the end and on a
  # preemption).
  config.checkpoint_every = 1000
  # The newest persistent checkpoints kept.
  config.keep_checkpoints = 3
  # Where the persistent checkpoints go ('': WORKDIR/checkpoints); storage
  # every host shares on a multi-host job (e.g. gs://...).
  config.checkpoint_dir = ''
  # Write a persistent checkpoint while training goes on.
  config.async_checkpointing = True
  # The local tier (runtime/checkpoints/local_checkpoint.py): every process
  # keeps its own copy of the state, the newest keep_local_checkpoints of
  # them, in local_checkpoint_dir ('': /dev/shm, else the temporary
  # directory). After a hard failure the job resumes from the newest copy
  # any process holds (runtime/checkpoints/recovery.py). Unset: at the
  # interval that makes copies and recomputed steps cost least (Daly's, from
  # what a copy blocks the loop, the restore, and the job's mean time between
  # failures, an hour by default; at most 60 s, at least 25 steps, never
  # over 2 % of the loop: runtime/checkpoints/local_cadence.py). Set: a copy
  # every local_checkpoint_every steps as asked (0: never).
  config.local_checkpoint_every = config_dict.placeholder(int)
  # Above 0: a local copy about every this many seconds of training instead,
  # never blocking the loop over 2 % of its time.
  config.local_checkpoint_every_s = 0.0
  # The newest local copies each process keeps.
  config.keep_local_checkpoints = 2
  # Where the local copies go ('': /dev/shm, else the temporary directory).
  config.local_checkpoint_dir = ''
  # Other jobs' copies on a host, unwritten this long, are removed at start
  # (and at once when their checkpoint directory is gone):
  # runtime/checkpoints/local_leftovers.py.
  config.local_checkpoint_leftover_hours = 24.0
  # Resume from the latest checkpoint in checkpoint_dir; False starts afresh
  # and refuses a directory that already holds checkpoints.
  config.restore = True
  # Fields (or whole sections) of model, optimizer, data, ... that may differ
  # from the checkpoint's when resuming, e.g. ('optimizer.learning_rate',).
  config.restore_may_change = ()
  # Exit codes besides 75 (preempted) that the launcher's --max_restarts
  # retries; added to --retry_exit_codes.
  config.retry_exit_codes = ()


def _add_topology(config: config_dict.ConfigDict) -> None:
  """The pod the job expects; None accepts whatever is there."""
  config.topology = config_dict.ConfigDict()
  # The processes of the job.
  config.topology.num_processes = config_dict.placeholder(int)
  # The devices of each process.
  config.topology.local_devices = config_dict.placeholder(int)
  # 'cpu', 'gpu' or 'tpu'.
  config.topology.platform = config_dict.placeholder(str)
  # A Cloud TPU slice such as 'v4-32': implies the platform, the processes
  # and the devices per process (runtime/common/accelerators.py), and
  # scripts/launch_tpu_pod.sh checks the pod against it before launching.
  config.topology.accelerator_type = config_dict.placeholder(str)
  # Slices of that type in a multislice job (scripts/launch_tpu_pod.sh
  # --num_slices): processes = hosts per slice x num_slices.
  config.topology.num_slices = config_dict.placeholder(int)
