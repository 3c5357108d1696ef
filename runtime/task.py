"""What a workload gives `train` (`Task`) and what it gets back
(`TrainResult`).

Example:
  >>> task = Task(params=params, loss_fn=loss_fn, optimizer=optax.sgd(0.1),
  ...             data=runtime.ArraySource(x=x, y=y))
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import optax

from runtime.common import deprecations
from runtime.common import exit_codes
from runtime import fingerprint as fingerprint_lib
from runtime import hooks as hooks_lib
from runtime import loss_scale as loss_scale_lib
from runtime import randomness
from runtime import step as step_lib


@dataclasses.dataclass(frozen=True)
class Task:
  """What a training workload hands to `train`.

  Attributes:
    params: initial parameters, a pytree of host arrays, identical on every
      process (draw them from the config's seed).
    loss_fn: `(params, batch[, rng]) -> (loss, metrics)` on one device's
      examples; with model_state, `(params, model_state, batch[, rng]) ->
      (loss, (metrics, new_model_state))`. loss and metrics are scalars
      (means over the device's examples), or `runtime.Weighted(total,
      weight)` of scalars, summed over the whole step before dividing (an
      LM's summed token loss and its token count: runtime/weighted.py).
    optimizer: an optax transformation.
    data: the training examples, random access: `len(data)` and
      `data[i] -> example` (a pytree of arrays), or `data.read_batch(ids)`
      for many at once (`runtime.data.ArraySource`); a grain `MapDataset`
      qualifies. The loop reads ids in the exactly-once order of
      runtime/data.py.
    model_state: the model's variables besides params that the forward pass
      updates, such as Flax's `batch_stats`; float leaves, kept identical on
      every device by a pmean after every step. None: the model has none.
    rng: pass loss_fn a last argument, a PRNG key, by one of two contracts
      (runtime/randomness.py). 'example': uint32 (n, 2), a key for each of
      its n examples, from the step and the example's position in the
      global batch, so an example draws the same numbers on any topology
      and microbatching (`runtime.dropout(rng, rate, x)` drops per
      example; `runtime.per_example` runs Flax's dropout layers per
      example). 'device': uint32 (2,), one key per call, what Flax's
      nnx.Dropout, linen's Dropout and jax.random take as they are; its
      draws change with the number of devices and microbatches. Either
      way the step's key comes from the checkpointed state, so a resumed
      run draws the same keys.
    loss_uses_rng: True is rng='device' (what it meant before rng existed).
    eval_fn: optional `(params, model_state) -> {name: value}`, run on
      every process every config.eval_every steps and at the end with the
      replicated state placed for the run's parallelism (`runtime.evaluate`
      scores a data source exactly); its results go to metrics.jsonl as
      eval_*.
    schedule: the optimiser's learning-rate schedule, `count -> rate`; when
      given, the rate is logged with the metrics.
    hooks: more hooks (runtime/hooks.py), called after the built-in ones.
    shard_dims: with config.state_layout='sharded', {leaf pattern:
      dimension, or None for whole} where the rule's choice will not do
      (runtime/parallelism/state_layout.py `specs`); config.shard_dims
      wins over it.
    flops_per_example: the model's FLOPs for one example, forward and
      backward (6 x parameters x tokens, plus attention, for a decoder);
      None: XLA's cost analysis of the compiled step counts them
      (runtime/flops.py). The step lines' TFLOP/s and MFU come from it.
    tokens_per_example: where examples are sequences, their length; the
      step lines then give tokens_per_sec.
    loss_scale: a dynamic loss scale for float16 (runtime/loss_scale.py,
      Flax's DynamicScale step for step): the loss is scaled before
      differentiating, a step whose gradients are not all finite is
      skipped (its non-finite loss then stops nothing) and the scale backs
      off; None: none.
    evaluate: the old name of `eval_fn`, kept for one release.
  """
  params: Any
  loss_fn: step_lib.LossFn
  optimizer: optax.GradientTransformation
  data: Any
  model_state: Any = None
  loss_uses_rng: bool = False
  rng: Optional[str] = None
  eval_fn: Optional[Callable[[Any, Any], dict[str, float]]] = None
  schedule: Optional[Callable[[int], Any]] = None
  hooks: Sequence[hooks_lib.Hook] = ()
  shard_dims: Optional[Mapping[str, Optional[int]]] = None
  flops_per_example: Optional[float] = None
  tokens_per_example: Optional[int] = None
  loss_scale: Optional[loss_scale_lib.DynamicScale] = None
  evaluate: Optional[Callable[[Any, Any], dict[str, float]]] = None

  def __post_init__(self):
    randomness.contract(self.rng, self.loss_uses_rng)  # Refuses a typo now.
    _check_data(self.data)
    if self.evaluate is not None:
      deprecations.warn('Task(evaluate=...)', stacklevel=4)
      if self.eval_fn is not None:
        raise ValueError('Task got both eval_fn and evaluate (its old name); '
                         'give eval_fn alone')
      object.__setattr__(self, 'eval_fn', self.evaluate)
      object.__setattr__(self, 'evaluate', None)

  def step_optimizer(self) -> optax.GradientTransformation:
    """The optimiser the step runs: `optimizer`, under the loss scale's
    wrapper where the task has one."""
    if self.loss_scale is None:
      return self.optimizer
    return loss_scale_lib.wrap(self.optimizer, self.loss_scale)


class DataSourceError(exit_codes.ConfigError):
  """Task.data is not a random-access source (exit 2)."""


def _check_data(data: Any) -> None:
  """Refuses a Task.data without `len` and random access, with the fix."""
  has_len = hasattr(type(data), '__len__')
  readable = (hasattr(type(data), '__getitem__') or
              callable(getattr(data, 'read_batch', None)))
  if has_len and readable:
    return
  missing = ' and '.join(
      n for n, ok in (('len(data)', has_len), ('data[i]', readable)) if not ok)
  raise DataSourceError(
      f'Task.data is {type(data).__module__}.{type(data).__name__}, which '
      f'has no {missing}. podrun reads examples by index, every one once '
      'an epoch in an order a resumed run continues exactly, so it needs '
      'len(data) and data[i] -> example (or data.read_batch(ids)); an '
      'iterator (a generator, tf.data, a tfds or grain iterator) has '
      'neither. Load the arrays into runtime.ArraySource(**arrays), or give '
      'a random-access source: a grain MapDataset (grain.MapDataset.source'
      '(...)) or any object with __len__ and __getitem__.')


@dataclasses.dataclass
class TrainResult:
  """What `train` returns, on every process.

  Attributes:
    final_metrics: the metrics of the last step this process ran ({} when
      it ran none).
    eval_metrics: the last evaluation's results, eval_*.
    fingerprint: of the final parameters; the same on every process.
    params: the final parameters, host numpy arrays.
    model_state: the final model state, host numpy arrays ({} for none).
    start_step: the step this run started from.
    steps: the step it ended at.
    extra: anything a workload adds for summary.json's results.
    topology: what computed the steps: num_processes, num_devices,
      microbatches.
    chip: the device kind, its peak, FLOPs per step and the run's TFLOP/s
      per device, MFU and tokens/s (runtime/flops.py `Figures.summary`).
    trained: False when the checkpoint was already at `steps` and this run
      trained nothing: the launcher then leaves the record (summary.json)
      as the run that trained wrote it.
  """
  final_metrics: dict[str, float]
  eval_metrics: dict[str, float]
  fingerprint: fingerprint_lib.Fingerprint
  params: Any
  model_state: Any
  start_step: int
  steps: int
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)
  topology: dict[str, int] = dataclasses.field(default_factory=dict)
  chip: dict[str, Any] = dataclasses.field(default_factory=dict)
  trained: bool = True

  def summary(self) -> dict[str, Any]:
    """The JSON-able part, for summary.json: no parameters."""
    out = {
        'fingerprint': self.fingerprint,
        'start_step': self.start_step,
        'eval': self.eval_metrics,
        'topology': self.topology,
        'chip': self.chip
    }
    if jax.tree_util.tree_leaves(self.model_state):
      out['model_state_fingerprint'] = fingerprint_lib.fingerprint(
          self.model_state)
    return {**out, **self.extra}
