"""Checkpoints on local disk against a bucket: save, restore, the loop's wait.

The MNIST MLP's TrainState (784-512-512-10, Adam: parameters and two moments)
saved and restored by runtime/checkpoints/checkpoint.py, side by side in one
run, into a local temporary directory and into a bucket of fake-gcs-server on
127.0.0.1 (tests/gcs.py; the test extra installs it), and into the same bucket
behind a proxy that delays every request by --latency_ms (a distant bucket's
round trip). Each round times:

- blocking: what the training loop waits for a save, as SaveCheckpoints
  does it: the copy of the state (on this process's first device) to the
  host and the save call, before orbax's asynchronous write goes on;
- save: from the call to the committed checkpoint;
- restore: reading the newest checkpoint back into host arrays.

  python tests/benchmarks/benchmark_buckets.py [--rounds=5] [--latency_ms=50]
      [--out=FILE.json]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from launcher.process import devices  # pylint: disable=g-import-not-at-top,wrong-import-position

devices.configure(None, multi_process=False)

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import optax  # pylint: disable=g-import-not-at-top,wrong-import-position

from configs import mnist as mnist_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.checkpoints import checkpoint  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime import fingerprint  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime import step as step_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.workloads import mnist  # pylint: disable=g-import-not-at-top,wrong-import-position
from scripts import side_by_side  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import gcs as gcs_lib  # pylint: disable=g-import-not-at-top,wrong-import-position


def _state():
  config = mnist_config.get_config()
  params = mnist.init_params(config, 784)
  state = step_lib.init_state(params, optax.adam(1e-3), config.seed)
  return (jax.device_put(state,
                         jax.devices()[0]),
          fingerprint.fingerprint(params)['num_params'])


def _round(directory: str, state, step: int) -> dict:
  ckpt = checkpoint.Checkpoints(directory, every=0, keep=2, async_save=True)
  started = time.perf_counter()
  host_state = jax.device_get(state)
  ckpt.save(step, host_state, {'step': step})
  blocking = time.perf_counter() - started
  ckpt.close()
  saved = time.perf_counter() - started
  started = time.perf_counter()
  restored = ckpt_restore(directory, host_state)
  restore = time.perf_counter() - started
  for got, want in zip(jax.tree_util.tree_leaves(restored),
                       jax.tree_util.tree_leaves(host_state)):
    np.testing.assert_array_equal(got, want)
  return {'blocking_s': blocking, 'save_s': saved, 'restore_s': restore}


def ckpt_restore(directory: str, like):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  manager = ocp.CheckpointManager(directory, item_names=('state', 'meta'))
  step = manager.latest_step()
  return manager.restore(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardRestore(like)))['state']


def _one(where: str, directory: str) -> None:
  """One round in this process (the clients read their endpoints once per
  process, so each round runs in a fresh one)."""
  state, _ = _state()
  print(json.dumps(_round(directory, state, 1)))


def _in_a_process(where: str, directory: str, env: dict) -> dict:
  out = subprocess.run(
      [sys.executable, __file__, f'--one={where}', f'--directory={directory}'],
      env={
          **os.environ,
          **env
      },
      capture_output=True,
      text=True,
      check=True,
      timeout=600)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--latency_ms', type=float, default=50)
  parser.add_argument('--out', default='')
  parser.add_argument('--one', default='', help=argparse.SUPPRESS)
  parser.add_argument('--directory', default='', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.one:
    _one(args.one, args.directory)
    return
  _, num_params = _state()
  results = {
      'num_params': num_params,
      'saved_floats': 3 * num_params,
      'jax_version': jax.__version__,
      'latency_ms': args.latency_ms
  }
  rounds = {'local': [], 'bucket': [], 'slow_bucket': []}
  with tempfile.TemporaryDirectory() as tmp:
    server = gcs_lib.FakeGcs(pathlib.Path(tmp)).start()
    try:
      server.bucket('bench')
      with gcs_lib.SlowProxy(server.url, args.latency_ms / 1000) as slow:
        for i in range(args.rounds):  # Alternated: the noise is shared.
          rounds['local'].append(_in_a_process('local', f'{tmp}/local/{i}', {}))
          rounds['bucket'].append(
              _in_a_process('bucket', f'gs://bench/ckpt/{i}', server.env()))
          rounds['slow_bucket'].append(
              _in_a_process('slow_bucket', f'gs://bench/slow/{i}', {
                  **server.env(),
                  **slow.env()
              }))
    finally:
      server.stop()
  side_by_side.report(results, rounds, args.out)


if __name__ == '__main__':
  main()
