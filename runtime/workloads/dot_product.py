"""Dot products of many pairs of 3-d vectors: pmap(vmap(dot)) against vmap(dot).

Each process draws its share of `config.num_pairs` pairs, (n, 3) each, and
computes their dot products twice: once with jit(vmap(dot)) on the flat
(n, 3) arrays on one device, once with pmap(vmap(dot)) on the arrays reshaped
to (local_devices, n / local_devices, 3), one entry per device. The flattened
pmap result must equal the vmap one. With `config.reshape = False` the flat
arrays go to pmap unchanged, which the runtime refuses with an explanation.
"""

from typing import Any

import jax
from jax import lax
import jax.numpy as jnp
from ml_collections import ConfigDict
import numpy as np

import runtime
from runtime import parallelism


def make_vectors(config: ConfigDict, process_index: int,
                 process_count: int) -> tuple[np.ndarray, np.ndarray]:
  """This process's share of the pairs: two (num_pairs / processes, 3) arrays."""
  n = config.num_pairs // process_count
  if n * process_count != config.num_pairs:
    raise parallelism.BatchSizeError(
        f'config.num_pairs={config.num_pairs} does not divide over '
        f'{process_count} processes')
  rng = np.random.default_rng([config.seed, process_index])
  return (rng.standard_normal(
      (n, 3), np.float32), rng.standard_normal((n, 3), np.float32))


def train_and_evaluate(config: ConfigDict, workdir: str) -> dict[str, Any]:
  """Compares the two ways of computing the dot products; returns shapes and
  whether they agree, on this process and on all of them."""
  del workdir
  process_index, local_devices = jax.process_index(), jax.local_device_count()
  v1s, v2s = make_vectors(config, process_index, jax.process_count())
  dot_batched = jax.jit(jax.vmap(jnp.dot))
  flat = np.asarray(dot_batched(v1s, v2s))

  dot_parallel = parallelism.device_map(jax.vmap(jnp.dot))
  if config.reshape:
    v1s = parallelism.split_for_devices(v1s, local_devices, 'v1s')
    v2s = parallelism.split_for_devices(v2s, local_devices, 'v2s')
  per_device = np.asarray(dot_parallel(v1s, v2s))

  equal = bool(np.array_equal(per_device.reshape(-1), flat))
  max_abs_diff = float(np.max(np.abs(per_device.reshape(-1) - flat)))
  # Agreement on every process, through one collective over all devices.
  all_equal = parallelism.device_map(
      lambda x: lax.pmin(x, parallelism.DATA_AXIS))(np.full(
          local_devices, equal, np.int32))
  runtime.progress.report(1, process_index, force=True)
  return {
      'num_pairs': config.num_pairs,
      'process_input_shape': list(flat.shape) + [3],
      'device_input_shape': list(v1s.shape),
      'pmap_output_shape': list(per_device.shape),
      'vmap_output_shape': list(flat.shape),
      'equal': equal,
      'equal_on_all_processes': bool(np.asarray(all_equal)[0]),
      'max_abs_diff': max_abs_diff,
  }
