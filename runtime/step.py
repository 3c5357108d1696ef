"""The data-parallel update step over every device of every process.

Parameters, model state and optimiser state are replicated arrays without a
stacked device axis, the same on every device: the `pmean`s make the update
identical everywhere. The step runs as a pmap or as jit(shard_map) over a
mesh of all devices (`runtime/parallelism/`); it is the same per-device
function either way. `make_sharded_train_step` runs it with the state split
over each replica's devices instead (runtime/parallelism/state_layout.py).
"""

from typing import Any, Callable, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np
import optax

from runtime import loss_contract
from runtime import loss_scale as loss_scale_lib
from runtime import parallelism as parallelism_lib
from runtime.parallelism import collectives
from runtime.parallelism import microbatches as microbatches_lib
from runtime.parallelism import state_layout
from runtime import randomness
from runtime import structure
from runtime import weighted as weighted_lib

# The mesh / pmap axis that spans every device of every process.
_AXIS = parallelism_lib.DATA_AXIS
LossFn = loss_contract.LossFn


class TrainState(NamedTuple):
  """Everything the next step depends on besides its batch.

  Attributes:
    params: the model's parameters, which the optimiser updates.
    model_state: the model's other variables, which the forward pass updates
      (BatchNorm's batch statistics); {} when the model has none.
    opt_state: the optimiser's state.
    rng: a raw uint32[2] PRNG key, split once per step, so a resumed run
      draws the same random numbers as one that never stopped.
  """
  params: Any
  model_state: Any
  opt_state: Any
  rng: Any


def _loss_and_grads(loss_fn: LossFn,
                    state: TrainState,
                    batch: Any,
                    extra: tuple,
                    has_model_state: bool,
                    axis: Any = _AXIS,
                    scale: Any = None):
  """(loss, metrics, new model_state, grads) of one device's batch, the loss
  a `Weighted` (a plain loss with weight 1) and the grads those of its
  total; with a loss `scale` (runtime/loss_scale.py), the gradients of the
  scaled total, unscaled in float32, as Flax's DynamicScale takes them."""
  checked = loss_contract.checked_output(loss_fn, has_model_state, axis)

  def summed(*args):
    loss, aux = checked(*args)
    loss = weighted_lib.parts(loss)
    return loss.total, (loss.weight, aux)

  differentiated = (summed if scale is None else loss_scale_lib.scaled(
      summed, scale))
  args = ((state.params, state.model_state, batch,
           *extra) if has_model_state else (state.params, batch, *extra))
  (total, (weight, aux)), grads = jax.value_and_grad(differentiated,
                                                     has_aux=True)(*args)
  if scale is not None:
    total, grads = loss_scale_lib.unscaled(total, grads, scale)
  loss = weighted_lib.Weighted(total, weight)
  if not has_model_state:
    return loss, aux, state.model_state, grads
  metrics, model_state = aux
  return loss, metrics, model_state, grads


def _as_sums(loss: weighted_lib.Weighted,
             metrics: Any) -> dict[str, weighted_lib.Weighted]:
  """{name: Weighted} of one group's metrics and its loss: each to be summed
  over the step's groups and divided once (runtime/weighted.py)."""
  return {
      **{
          name: weighted_lib.parts(v) for name, v in metrics.items()
      }, 'loss': loss
  }


def _group_values(loss_fn: LossFn,
                  state: TrainState,
                  group: Any,
                  extra: tuple,
                  has_model_state: bool,
                  axis: Any = _AXIS,
                  scale: Any = None):
  """({name: Weighted} of the metrics and 'loss', new model_state, grads
  of the loss's total) of one group."""
  loss, metrics, model_state, grads = _loss_and_grads(loss_fn, state, group,
                                                      extra, has_model_state,
                                                      axis, scale)
  structure.check_same('model_state', state.model_state, model_state,
                       loss_contract.MODEL_STATE_HINT)
  return _as_sums(loss, metrics), model_state, grads


def _reduced(sums: tuple, axis: Any, groups: Any):
  """(metrics, model_state, grads) of the step from one device's sums over
  its real groups: each summed over `axis`; a metric is its total over its
  weight, the grads are over the loss's weight, and the model state is the
  mean over the step's `groups` real groups."""
  pairs, model_state, grads = lax.psum(sums, axis)
  metrics = {name: weighted_lib.value(v, groups) for name, v in pairs.items()}
  weight = pairs['loss'].weight
  grads = jax.tree_util.tree_map(
      lambda g: weighted_lib.divided(g, groups
                                     if weight is None else weight), grads)
  model_state = jax.tree_util.tree_map(lambda x: x / groups, model_state)
  return metrics, model_state, grads


def _accumulated(loss_fn: LossFn,
                 state: TrainState,
                 batch: Any,
                 step_rng,
                 layout: microbatches_lib.Layout,
                 rng: Optional[str],
                 has_model_state: bool,
                 axis: Any = _AXIS,
                 scale: Any = None):
  """Metrics, model state and grads over the step's real groups.

  One device's batch, (k x m, ...) per leaf, runs as k groups of m, one
  after another (`lax.scan` when k > 1, so that only one group's
  activations live at a time). A padding group's zero rows are computed
  like any others, and its values (weights included) are then replaced by
  zeros (`where`, which also drops a NaN they gave); the sums over the
  devices are divided by the real groups' weights alone (`_reduced`).
  Computing the padding costs no wall time: the padding is the batch's
  tail, so device 0 runs k real groups whenever a step has any padding.
  (Skipping it with `lax.cond` instead made the CNN of configs/mnist_cnn.py
  9x slower on XLA:CPU; BUILD_NOTES.md.)
  """
  k, m = layout.microbatches, layout.microbatch_size
  groups = jax.tree_util.tree_map(lambda x: x.reshape((k, m) + x.shape[1:]),
                                  batch)
  first = lax.axis_index(axis) * k

  def counted(group, j):
    index = first + j
    extra = randomness.keys_for(rng, step_rng, index, index * m, m)
    out = _group_values(loss_fn, state, group, extra, has_model_state, axis,
                        scale)
    real = index < layout.real_groups
    return jax.tree_util.tree_map(
        lambda x: jnp.where(real, x, jnp.zeros_like(x)), out)

  if k == 1:
    sums = counted(jax.tree_util.tree_map(lambda x: x[0], groups), 0)
  else:

    def one(sums, xs):
      return jax.tree_util.tree_map(jnp.add, sums, counted(xs[1], xs[0])), None

    zeros = jax.tree_util.tree_map(
        lambda s: jnp.zeros(s.shape, s.dtype),
        jax.eval_shape(counted, jax.tree_util.tree_map(lambda x: x[0], groups),
                       0))
    sums, _ = lax.scan(one, zeros, (jnp.arange(k), groups))
  return _reduced(sums, axis, layout.real_groups)


def loss_collectives(loss_fn: LossFn, state: TrainState, group: Any,
                     rng: Optional[str], has_model_state: bool, axis: Any,
                     num_devices: int) -> tuple[str, ...]:
  """The collectives over `axis` that loss_fn takes on one group, read from
  the jaxpr of the step's forward and backward pass (nothing runs).

  Args:
    loss_fn, rng, has_model_state: as `make_train_step`.
    state: a TrainState of arrays or `jax.ShapeDtypeStruct`s.
    group: one group's batch, arrays or structs, (m, ...) per leaf.
    axis: the axis the step maps over every device.
    num_devices: that axis's size.

  Returns:
    The primitives' names (`collectives.over_axis`); () for a loss that
    mixes no rows between devices.
  """
  rows = jax.tree_util.tree_leaves(group)[0].shape[0]
  explained = randomness.explained(loss_fn, rng)

  def values(state, group, step_rng):
    extra = randomness.keys_for(rng, step_rng, 0, 0, rows)
    return _loss_and_grads(explained, state, group, extra, has_model_state,
                           axis)

  key = jax.ShapeDtypeStruct((2,), jnp.uint32)
  jaxpr = jax.make_jaxpr(values, axis_env=[(axis, num_devices)])(state, group,
                                                                 key)
  return collectives.over_axis(jaxpr, axis)


def make_train_step(loss_fn: LossFn,
                    optimizer: optax.GradientTransformation,
                    parallelism: parallelism_lib.Parallelism,
                    rng: Optional[str] = None,
                    has_model_state: bool = False,
                    layout: Optional[microbatches_lib.Layout] = None,
                    steps: int = 1,
                    loss_scale: bool = False) -> Callable:
  """Builds the data-parallel step `(state, batch) -> (state, metrics)`.

  Each device computes the loss and gradients of its share of the batch; the
  gradients, the metrics and the new model state are averaged with
  `lax.pmean` over `parallelism.axis` (config.axis_name, 'devices' unless
  set), which spans all devices of all processes, and
  every device applies the same optimiser update. Since every device holds
  the same number of examples, the mean of the per-device means is the mean
  over the global batch.

  Args:
    loss_fn: see `LossFn`.
    optimizer: an optax transformation.
    parallelism: `parallelism.PMAP` or `parallelism.SHARD_MAP`.
    rng: None, or pass loss_fn a last argument (runtime/randomness.py):
      'example', uint32 (n, 2), a key for each of its n examples, from the
      step and the example's position in the global batch, the same on any
      topology and in any microbatch; 'device', uint32 (2,), one key for
      the call, from the step and the call's device and microbatch.
    has_model_state: loss_fn takes and returns model state (see `LossFn`);
      its float leaves are averaged over the devices after every step.
    layout: how the step's examples sit on the devices
      (`parallelism.microbatches.plan`); None or one microbatch of G / D
      without padding: each device computes its share in one pass. Else
      each device runs its k groups one after another and the step
      averages over the real groups (see `_accumulated`).
    steps: how many steps one call runs (config.steps_per_dispatch), one
      after another in a `lax.scan`: the same updates and keys as as many
      calls. Each device's rows are then the steps' rows in step order
      (`runtime.dispatch.stack`).
    loss_scale: the optimiser is `loss_scale.wrap`'s and its state a
      `ScaleState`: the loss is scaled by it before differentiating, each
      device's gradients unscaled before the pmean, and the metrics gain
      `loss_scale.metrics`.

  Returns:
    step(state, batch) with state a replicated `TrainState` and batch placed
    by `parallelism.put_batch`; returns the new replicated state and a dict
    of replicated scalar metrics that includes 'loss', each of shape
    (steps,) when steps > 1. The input state is donated.

  Example:
    >>> step = make_train_step(loss_fn, optax.sgd(0.1), parallelism.PMAP)
    >>> state, metrics = step(state, parallelism.PMAP.put_batch(batch))
  """
  loss_contract.check_loss_fn(loss_fn, rng is not None, has_model_state)
  values = _device_values(randomness.explained(loss_fn, rng),
                          rng,
                          layout,
                          has_model_state,
                          axis=parallelism.axis)

  def step(state: TrainState, batch: Any):
    next_rng, step_rng = jax.random.split(state.rng)
    scale = state.opt_state.scale if loss_scale else None
    metrics, model_state, grads = values(state, batch, step_rng, scale)
    new = _applied(optimizer, state, grads, model_state, next_rng)
    return new, _with_scale_metrics(metrics, new)

  return parallelism.map(_scanned(step, steps, _device_steps),
                         in_axes=(None, 0),
                         out_axes=(None, None),
                         donate_argnums=(0,))


def _device_steps(batch: Any, steps: int) -> Any:
  """One device's rows of `steps` steps, (steps x n, ...) per leaf, in step
  order, as (steps, n, ...)."""
  return jax.tree_util.tree_map(lambda x: x.reshape((steps, -1) + x.shape[1:]),
                                batch)


def _scanned(step: Callable, steps: int, split: Callable) -> Callable:
  """`step`, or with steps > 1 a function running it `steps` times over the
  batches `split(batch, steps)` cuts: `(state, batch) -> (state, metrics
  stacked over the steps)`."""
  if steps == 1:
    return step

  def run(state, batch):
    return lax.scan(step, state, split(batch, steps))

  return run


def _device_values(loss_fn: LossFn,
                   contract: Optional[str],
                   layout: Optional[microbatches_lib.Layout],
                   has_model_state: bool,
                   axis: Any = _AXIS) -> Callable:
  """One device's part of a step: `(state, batch, step_rng) -> (metrics,
  model_state, grads)`, each averaged over every device.

  `axis` names every device.
  """
  one_pass = layout is None or (layout.microbatches == 1 and
                                not layout.padded_groups)

  def values(state: TrainState, batch: Any, step_rng, scale=None):
    # The step of before accumulation, bit for bit (a None layout is one
    # pass; the test says so to the type checker).
    if one_pass or layout is None:
      rows = jax.tree_util.tree_leaves(batch)[0].shape[0]
      device = lax.axis_index(axis)
      extra = randomness.keys_for(contract, step_rng, device, device * rows,
                                  rows)
      return _reduced(
          _group_values(loss_fn, state, batch, extra, has_model_state, axis,
                        scale), axis, lax.psum(1, axis))
    return _accumulated(loss_fn, state, batch, step_rng, layout, contract,
                        has_model_state, axis, scale)

  return values


def _applied(optimizer: optax.GradientTransformation, state: TrainState,
             grads: Any, model_state: Any, next_rng) -> TrainState:
  """The state after the optimiser's update with `grads`."""
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  structure.check_same('the optimiser\'s updates',
                       state.params,
                       updates,
                       dtypes=False)
  structure.check_same('the optimiser state', state.opt_state, opt_state)
  params = optax.apply_updates(state.params, updates)
  if isinstance(opt_state, loss_scale_lib.ScaleState):
    params = loss_scale_lib.kept_where_skipped(opt_state, params, state.params)
  structure.check_same('params', state.params, params)
  return TrainState(params, model_state, opt_state, next_rng)


def _with_scale_metrics(metrics: dict, new: TrainState) -> dict:
  """The step's metrics, with the loss scale's where it has one."""
  if isinstance(new.opt_state, loss_scale_lib.ScaleState):
    return {**metrics, **loss_scale_lib.metrics(new.opt_state)}
  return metrics


def make_sharded_train_step(loss_fn: LossFn,
                            optimizer: optax.GradientTransformation,
                            placed: TrainState,
                            rng: Optional[str] = None,
                            has_model_state: bool = False,
                            layout: Optional[microbatches_lib.Layout] = None,
                            steps: int = 1,
                            loss_scale: bool = False,
                            axis: str = _AXIS) -> Callable:
  """The step of `make_train_step` under `parallelism.SHARD_MAP`, with the
  state split over each replica's devices: the same per-device values, the
  same update, each leaf living where `placed` says, and no device holding
  the whole parameters or gradients at once (FSDP).

  Each device's loss is mapped with `jax.vmap` over a leading device
  dimension of the batch, under the same axis name as the replicated step
  (so a model's own collectives still span every device), and that
  dimension is split over the (replicas, shards) mesh of
  runtime/parallelism/state_layout.py (`spmd_axis_name`), whose devices,
  flattened, are the global mesh's in its order: each device computes the
  rows of the batch it computes replicated. The gradient is then taken of
  the mean of those losses, through the map, rather than per device and
  averaged after: each weight's gradient is one contraction over every
  device's rows, which XLA's partitioner reduce-scatters into the shards
  `placed` keeps where the layer's backward pass makes it, as it gathers a
  split parameter where a layer uses it (MaxText's FSDP). A model whose
  layers are a `lax.scan` under `jax.checkpoint` then holds one layer's
  parameters and gradients whole at a time. The optimiser updates the
  shards under jit, which sees global arrays, so an update that reduces
  over a leaf (a global norm) reduces over all of it.

  Args:
    loss_fn, optimizer, rng, has_model_state, layout, steps, loss_scale: as
      `make_train_step`.
    axis: the name the model's own collectives use for the batch axis
      (config.axis_name), bound by the map over devices.
    placed: a TrainState of NamedShardings (`state_shardings`).

  Returns:
    step(state, batch): state placed by `placed`, batch placed by
    `parallelism.SHARD_MAP.put_batch`; returns the new state, placed the
    same, and the replicated metrics. The input state is donated.
  """
  loss_contract.check_loss_fn(loss_fn, rng is not None, has_model_state)
  placements = jax.tree_util.tree_leaves(placed.params)
  grid = placements[0].mesh
  every = (state_layout.REPLICA_AXIS, state_layout.SHARD_AXIS)
  total = _global_loss(randomness.explained(loss_fn, rng), rng, layout,
                       has_model_state, grid.size, every, axis)
  by_device = NamedSharding(grid, PartitionSpec(every))

  def step(state: TrainState, batch: Any):
    next_rng, step_rng = jax.random.split(state.rng)
    rows = jax.tree_util.tree_map(
        lambda x: lax.with_sharding_constraint(
            x.reshape((grid.size, -1) + x.shape[1:]), by_device), batch)
    scale = state.opt_state.scale if loss_scale else None
    loss_fn = total if scale is None else loss_scale_lib.scaled(total, scale)
    (loss, (metrics, model_state)), grads = jax.value_and_grad(
        loss_fn, has_aux=True)(state.params, state.model_state, rows, step_rng)
    if scale is not None:
      loss, grads = loss_scale_lib.unscaled(loss, grads, scale)
    grads = jax.tree_util.tree_map(lax.with_sharding_constraint, grads,
                                   placed.params)
    new = _applied(optimizer, state, grads, model_state, next_rng)
    return new, _with_scale_metrics({**metrics, 'loss': loss}, new)

  def global_steps(batch, steps):
    # Each device's rows are its rows of every step in step order: as
    # (devices, steps, n) the steps are a dimension of their own.
    def one(x):
      rows = x.reshape((grid.size, steps, -1) + x.shape[1:]).swapaxes(0, 1)
      rows = rows.reshape((steps, -1) + x.shape[1:])
      return lax.with_sharding_constraint(
          rows, NamedSharding(grid, PartitionSpec(None, every)))

    return jax.tree_util.tree_map(one, batch)

  whole = NamedSharding(parallelism_lib.global_mesh(), PartitionSpec())
  return jax.jit(_scanned(step, steps, global_steps),
                 out_shardings=(placed, whole),
                 donate_argnums=(0,))


def _global_loss(loss_fn: LossFn, contract: Optional[str],
                 layout: Optional[microbatches_lib.Layout],
                 has_model_state: bool, devices: int, every: tuple,
                 axis: str) -> Callable:
  """`(params, model_state, rows, step_rng) -> (loss, (metrics,
  model_state))`: the step's loss and metrics, each its total over its
  weight summed over every device's real groups (a plain value weighs 1),
  and the new model state, the mean over them; rows (devices, n, ...).

  The same values as `_device_values` averages, as one function of the
  parameters, so that its gradient is taken through the map over devices.
  """
  checked = loss_contract.checked_output(loss_fn, has_model_state, axis)
  k = 1 if layout is None else layout.microbatches
  one_pass = layout is None or (k == 1 and not layout.padded_groups)
  groups = devices if one_pass or layout is None else layout.real_groups

  def group_values(params, model_state, group, extra):
    if has_model_state:
      loss, (metrics, new_state) = checked(params, model_state, group, *extra)
      structure.check_same('model_state', model_state, new_state,
                           loss_contract.MODEL_STATE_HINT)
    else:
      (loss, metrics), new_state = checked(params, group, *extra), model_state
    return _as_sums(weighted_lib.parts(loss), metrics), new_state

  def device_sums(params, model_state, batch, step_rng):
    device = lax.axis_index(axis)
    if one_pass:
      rows = jax.tree_util.tree_leaves(batch)[0].shape[0]
      extra = randomness.keys_for(contract, step_rng, device, device * rows,
                                  rows)
      return group_values(params, model_state, batch, extra)
    m = layout.microbatch_size
    split = jax.tree_util.tree_map(lambda x: x.reshape((k, m) + x.shape[1:]),
                                   batch)

    def one(sums, xs):
      j, group = xs
      index = device * k + j
      extra = randomness.keys_for(contract, step_rng, index, index * m, m)
      out = group_values(params, model_state, group, extra)
      # A padding group counts nothing (`where` also drops a NaN it gave).
      out = jax.tree_util.tree_map(
          lambda x: jnp.where(index < layout.real_groups, x, jnp.zeros_like(x)),
          out)
      return jax.tree_util.tree_map(jnp.add, sums, out), None

    first = jax.tree_util.tree_map(lambda x: x[0], split)
    zeros = jax.tree_util.tree_map(
        lambda s: jnp.zeros(s.shape, s.dtype),
        jax.eval_shape(
            lambda g: group_values(
                params, model_state, g,
                randomness.keys_for(contract, step_rng, 0, 0, m)), first))
    sums, _ = lax.scan(one, zeros, (jnp.arange(k), split))
    return sums

  mapped = jax.vmap(device_sums,
                    in_axes=(None, None, 0, None),
                    axis_name=axis,
                    spmd_axis_name=every)

  def total(params, model_state, rows, step_rng):
    pairs, new_state = jax.tree_util.tree_map(
        lambda x: x.sum(0), mapped(params, model_state, rows, step_rng))
    metrics = {name: weighted_lib.value(v, groups) for name, v in pairs.items()}
    new_state = jax.tree_util.tree_map(lambda x: x / groups, new_state)
    return metrics.pop('loss'), (metrics, new_state)

  return total


def state_shardings(grid: Mesh, state_specs: Any) -> Any:
  """`state_specs`'s PartitionSpecs as NamedShardings on `grid`, for
  jax.device_put of a host state."""
  return jax.tree_util.tree_map(lambda spec: NamedSharding(grid, spec),
                                state_specs,
                                is_leaf=lambda x: isinstance(x, PartitionSpec))


def init_state(params: Any,
               optimizer: optax.GradientTransformation,
               seed: int = 0,
               model_state: Any = None) -> TrainState:
  """Fresh optimiser state and RNG key for `params`, on host (numpy).

  Pass the result to `parallelism.replicate` to train with it.
  """
  rng = np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32)
  return jax.device_get(
      TrainState(params, {} if model_state is None else model_state,
                 optimizer.init(params), rng))
