"""Measures how long one checkpoint save stalls training, as a fraction of a step.

Trains the MLP workload widened to at least 10 million parameters (Adam, so
the saved state is three times that) on this process's devices, times
steps with no save in progress, then starts one save and times:

- blocking: the time the training loop spends in the save call (copying the
  state to host and handing it to orbax) before it can dispatch the next step;
- slowdown: the extra time, over steps without a save, of the steps that run
  while the save is written in the background (on a CPU the writer competes
  with the step for the same cores);

for an asynchronous save and, for comparison, a synchronous one.

  python scripts/benchmark_checkpoint.py [--hidden=4096] [--out=FILE.json]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launcher.process import devices  # pylint: disable=g-import-not-at-top

devices.configure(None, multi_process=False)

import jax  # pylint: disable=g-import-not-at-top

from configs import mlp as mlp_config  # pylint: disable=g-import-not-at-top
from runtime.checkpoints import checkpoint  # pylint: disable=g-import-not-at-top
from runtime import data  # pylint: disable=g-import-not-at-top
from runtime import fingerprint  # pylint: disable=g-import-not-at-top
from runtime import parallelism  # pylint: disable=g-import-not-at-top
from runtime import step as step_lib  # pylint: disable=g-import-not-at-top
from runtime.workloads import mlp  # pylint: disable=g-import-not-at-top


def _measure(task, step_fn, state, batches, async_save, directory,
             baseline_steps):
  """Returns (blocking_s, slowdown_s, steps_during_save, step_s, state)."""

  def run_step(state, i):
    state, metrics = step_fn(state, batches[i % len(batches)])
    jax.block_until_ready(metrics)
    return state

  times = []
  for i in range(baseline_steps):
    t = time.perf_counter()
    state = run_step(state, i)
    times.append(time.perf_counter() - t)
  step_s = statistics.median(times)

  ckpt = checkpoint.Checkpoints(directory,
                                every=0,
                                keep=1,
                                async_save=async_save)
  t = time.perf_counter()
  host_state = jax.device_get(state)
  ckpt.save(1, host_state, {'step': 1})
  blocking_s = time.perf_counter() - t
  during, i = [], 0
  while ckpt.saving():
    t = time.perf_counter()
    state = run_step(state, i)
    during.append(time.perf_counter() - t)
    i += 1
  ckpt.close()
  slowdown_s = sum(d - step_s for d in during)
  return blocking_s, slowdown_s, len(during), step_s, state


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--features', type=int, default=2560)
  parser.add_argument('--hidden', type=int, default=4096)
  parser.add_argument('--global_batch_size', type=int, default=256)
  parser.add_argument('--baseline_steps', type=int, default=10)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--out', default='')
  args = parser.parse_args()

  config = mlp_config.get_config()
  config.data.features, config.model.hidden = args.features, args.hidden
  config.data.num_examples = 4 * args.global_batch_size
  config.global_batch_size = args.global_batch_size
  task, _ = mlp.make_task(config)
  num_params = fingerprint.fingerprint(task.params)['num_params']
  step_fn = step_lib.make_train_step(task.loss_fn, task.optimizer,
                                     parallelism.PMAP)
  state = parallelism.PMAP.replicate(
      step_lib.init_state(task.params, task.optimizer, config.seed))
  count = jax.local_device_count()
  batches = [
      parallelism.split_for_devices(
          task.data.read_batch(
              data.process_batch_ids(s, config.global_batch_size,
                                     config.data.num_examples, config.seed, 0,
                                     1, True)), count) for s in range(4)
  ]
  state, _ = step_fn(state, batches[0])  # Compile.

  results = {
      'jax_version': jax.__version__,
      'device_kind': jax.devices()[0].device_kind,
      'device_count': jax.device_count(),
      'num_params': num_params,
      'saved_floats': 3 * num_params
  }
  for mode, async_save in (('async', True), ('sync', False)):
    rounds = []
    for _ in range(args.rounds):
      with tempfile.TemporaryDirectory() as directory:
        blocking, slowdown, steps, step_s, state = _measure(
            task, step_fn, state, batches, async_save, directory,
            args.baseline_steps)
      rounds.append({
          'blocking_s': blocking,
          'slowdown_s': slowdown,
          'steps_during_save': steps,
          'step_s': step_s,
          'stall_fraction_of_step': (blocking + slowdown) / step_s,
          'blocking_fraction_of_step': blocking / step_s
      })
    results[mode] = {
        'rounds':
            rounds,
        'median_stall_fraction_of_step':
            statistics.median(r['stall_fraction_of_step'] for r in rounds),
        'median_blocking_fraction_of_step':
            statistics.median(r['blocking_fraction_of_step'] for r in rounds),
    }
  text = json.dumps(results, indent=2)
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text + '\n')


if __name__ == '__main__':
  main()
