"""Plain single-device gradient descent, the yardstick for data parallelism."""

import jax
import optax

from runtime import data


def single_device_descent(config, task):
  """Runs config.steps updates on one device, each on the whole global batch.

  Returns:
    The final parameters as host arrays.
  """
  device = jax.devices()[0]
  params = jax.device_put(task.params, device)
  opt_state = task.optimizer.init(params)

  @jax.jit
  def update(params, opt_state, batch):
    grads, _ = jax.grad(task.loss_fn, has_aux=True)(params, batch)
    updates, opt_state = task.optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  for step in range(config.steps):
    ids = data.global_batch_ids(step, config.global_batch_size, len(task.data),
                                config.seed, config.data.shuffle)
    batch = jax.device_put(data.read_batch(task.data, ids), device)
    params, opt_state = update(params, opt_state, batch)
  return jax.device_get(params)
