"""The baseline for the launcher's start-up cost: what a user writes by hand.

One process of an N-process job on this machine that calls
jax.distributed.initialize itself and runs one pmap'd linear-regression step
with a pmean over all devices, then prints the wall time since it started.

  python scripts/bare_distributed.py --process_id=0 --num_processes=2 --port=8476 &
  python scripts/bare_distributed.py --process_id=1 --num_processes=2 --port=8476
"""

import argparse
import time

STARTED = time.time()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax import lax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--process_id', type=int, required=True)
  parser.add_argument('--num_processes', type=int, required=True)
  parser.add_argument('--port', type=int, required=True)
  parser.add_argument('--local_devices', type=int, default=4)
  args = parser.parse_args()
  jax.config.update('jax_platforms', 'cpu')
  jax.config.update('jax_num_cpu_devices', args.local_devices)
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  address = f'127.0.0.1:{args.port}'
  jax.distributed.initialize(address,
                             args.num_processes,
                             args.process_id,
                             coordinator_bind_address=address)

  def update(params, x, y):
    grads = jax.grad(lambda p: jnp.mean((x @ p['w'] + p['b'] - y)**2))(params)
    grads = lax.pmean(grads, 'devices')
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

  step = jax.pmap(update, 'devices', in_axes=(None, 0, 0), out_axes=None)
  rng = np.random.default_rng(args.process_id)
  n = jax.local_device_count()
  params = {'w': np.zeros(3, np.float32), 'b': np.float32(0)}
  params = step(params,
                rng.normal(size=(n, 16, 3)).astype(np.float32),
                rng.normal(size=(n, 16)).astype(np.float32))
  jax.block_until_ready(params)
  print(f'first step done {time.time() - STARTED:.3f} s after start',
        flush=True)


if __name__ == '__main__':
  main()
