"""What `train` reads of a config, read once into typed values that the
loop, its hooks and the loader take instead of the ConfigDict. How a run
checkpoints is its own part: runtime/checkpoints/options.py.

Example:
  >>> options = TrainOptions.of(config, '/runs/mnist')
  >>> options.steps, options.logging.every, options.checkpointing.every
  (1000, 50, 500)
"""

import dataclasses
from typing import Optional

from ml_collections import ConfigDict

from runtime.checkpoints import options as checkpoint_options
from runtime.common import handoff
from runtime.common import layout
from runtime import dispatch
from runtime.parallelism import options as parallelism_options
from runtime import readers

# How a run checkpoints, `TrainOptions.checkpointing`'s type.
Checkpointing = checkpoint_options.Checkpointing
# The parallelism and the state's layout, `TrainOptions.placement`'s type.
Placement = parallelism_options.Placement


@dataclasses.dataclass(frozen=True)
class Data:
  """Which examples each step trains on (runtime/data.py).

  Attributes:
    global_batch_size: G, every device of the job together.
    seed: the data order's (and the state's initialisation).
    shuffle: whether each epoch is a new permutation.
    prefetch: batches loaded ahead of the step.
    on_device: the data set kept on every device, each batch gathered
      there (config.data.on_device); None: chosen by the run
      (runtime/device_data.py `choose`).
    workers: processes that read each batch's records (config.data.workers;
      0: this process reads them; -1: auto, runtime/readers.py).
  """
  global_batch_size: int
  seed: int
  shuffle: bool
  prefetch: int
  on_device: Optional[bool] = False
  workers: int = 0


@dataclasses.dataclass(frozen=True)
class Logging:
  """What process 0 writes while it trains.

  Attributes:
    every: a metrics line every this many steps (config.log_every).
    tensorboard: whether TensorBoard events are written too.
    profile_start: the first step a profile covers.
    profile_steps: how many steps it covers (0: no profile).
    metrics_prefix: put before the names of the step's own metrics and the
      learning rate where they are written (config.metrics_prefix).
  """
  every: int
  tensorboard: bool
  profile_start: int = 0
  profile_steps: int = 0
  metrics_prefix: str = ''


@dataclasses.dataclass(frozen=True)
class Groups:
  """How a device's share of a step is cut into passes, as the config asks
  (runtime/batch_layout.py chooses within it); None: not asked.

  Attributes:
    device_batch_limit: the most examples one pass takes.
    microbatches: passes per device in one step.
    microbatch_size: examples per pass, kept on any topology.
  """
  device_batch_limit: Optional[int] = None
  microbatches: Optional[int] = None
  microbatch_size: Optional[int] = None

  @classmethod
  def of(cls, config: ConfigDict) -> 'Groups':
    return cls(
        config.get('device_batch_limit') or None,
        config.get('microbatches') or None,
        config.get('microbatch_size') or None)

  def steered(self) -> bool:
    """Whether the config fixes the groups itself, so that nothing of a
    former attempt's is kept (runtime/checkpoints/batch_limit.py)."""
    return any(
        (self.device_batch_limit, self.microbatches, self.microbatch_size))


@dataclasses.dataclass(frozen=True)
class TrainOptions:
  """Everything of a config that `train` and its parts use.

  Attributes:
    steps: the step the run ends at.
    data: which examples each step trains on.
    logging: what it writes.
    eval_every: an evaluation every this many steps and at the end (0: at
      the end only), when the task has an eval_fn.
    integrity_every: the replica check's period in steps (0: at saves only).
    max_steps_in_flight: calls of the step that may be unfinished at once
      (None: chosen by platform, training.max_steps_in_flight).
    peak_tflops: config.peak_tflops, a measured ceiling for MFU (None: the
      device kind's datasheet figure).
    steps_per_dispatch: steps one call runs; None: 'auto'
      (runtime/dispatch.py).
    checkpointing: both checkpoint tiers.
    placement: the parallelism and where the state lives.
    groups: how a device's share is cut into passes.
    elastic: (fewest, most) processes the job may run on, as its launcher
      says (runtime/common/handoff.py); None for a fixed size.
    elastic_slices: the elastic job loses and regains whole slices.
    attempt: the attempt's name, as its launcher says; '' for none.
  """
  steps: int
  data: Data
  logging: Logging
  eval_every: int
  integrity_every: int
  max_steps_in_flight: Optional[int]
  checkpointing: Checkpointing
  peak_tflops: Optional[float] = None
  steps_per_dispatch: Optional[int] = 1
  placement: Placement = Placement()
  groups: Groups = Groups()
  elastic: Optional[tuple[int, int]] = None
  elastic_slices: bool = False
  attempt: str = ''

  @classmethod
  def of(cls,
         config: ConfigDict,
         record: layout.Record,
         told: Optional[handoff.Handoff] = None) -> 'TrainOptions':
    """Reads a config made from runtime/config_base.py, and what the
    launcher told this process (default: handoff.current())."""
    profile = config.get('profile') or {}
    told = told or handoff.current()
    return cls(steps=config.steps,
               data=Data(global_batch_size=config.global_batch_size,
                         seed=config.seed,
                         shuffle=bool(config.data.shuffle),
                         prefetch=config.prefetch,
                         on_device=(None if config.data.get('on_device', False)
                                    is None else bool(config.data.on_device)),
                         workers=readers.parse(
                             config.data.get('workers', 0) or 0)),
               logging=Logging(every=config.log_every,
                               tensorboard=bool(config.tensorboard),
                               profile_start=profile.get('start_step', 0) or 0,
                               profile_steps=profile.get('num_steps', 0) or 0,
                               metrics_prefix=config.get('metrics_prefix') or
                               ''),
               eval_every=config.eval_every,
               integrity_every=config.integrity_every,
               max_steps_in_flight=config.max_steps_in_flight,
               checkpointing=Checkpointing.of(config, record),
               peak_tflops=config.get('peak_tflops'),
               steps_per_dispatch=dispatch.parse(
                   config.get('steps_per_dispatch', dispatch.AUTO)),
               placement=Placement.of(config),
               groups=Groups.of(config),
               elastic=told.elastic,
               elastic_slices=told.elastic_slices,
               attempt=told.attempt or '')
