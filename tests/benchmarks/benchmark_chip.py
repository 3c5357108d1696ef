"""The loop against the chip: podrun's runtime, a hand-written loop and the
step alone, side by side in one process, on whatever JAX sees.

  python tests/benchmarks/benchmark_chip.py [--shape=gpt2_small|tiny]
      [--rounds=3] [--steps=40] [--mnist_steps=300] [--out=chip.json]

Two workloads: the decoder LM of configs/decoder.py (default GPT-2 small's
shape, 124 M parameters, bf16 compute, AdamW, sequences of 512, batch 16;
`--shape=tiny` for a CPU) and the MNIST MLP of configs/mnist.py (784-512-
512-10, Adam, batch 256, synthetic digits). Each is run four ways, in an
order that turns by one every round:

- podrun_pmap, podrun_shard_map: `runtime.train` with its defaults
  (metrics every config.log_every steps, TensorBoard, the replica check,
  prefetch), but checkpoints off;
- hand: `jax.jit` of the same step with the state donated, each batch cut
  from host memory and `jax.device_put`, no block until the end;
- on_device: that step on one batch already on the device.

Each run's speed counts steps 2 to N (the first compiles), from the end of
step 1 to the end of step N; a figure is the median over the rounds. MFU is
the model's FLOPs (`flops_per_example`) over the device kind's peak
(runtime/flops.py). Before any of it, two fresh processes time a one-step
job from their start to their end, compilation included: the launcher
(`python -m launcher --config=configs/decoder.py:SHAPE --config.steps=1`)
and a hand-written script of the same step (`--hand_first_step`).

On a CPU the in-process runs use one CPU device, as an accelerator host's
one chip. Prints a table and one JSON object (also to --out).
"""

import argparse
import functools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

METHODS = ('podrun_pmap', 'podrun_shard_map', 'hand', 'on_device')


def _lm_config(shape: str, steps: int):
  from configs import decoder  # pylint: disable=g-import-not-at-top
  config = decoder.get_config(shape)
  config.steps = steps
  return config


def _mnist_config(steps: int):
  from configs import mnist  # pylint: disable=g-import-not-at-top
  config = mnist.get_config()
  config.steps, config.eval_every = steps, 0
  return config


def _lm_task(config):
  from runtime.workloads import decoder  # pylint: disable=g-import-not-at-top
  return decoder.make_task(config)


def _mnist_task(config):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import runtime  # pylint: disable=g-import-not-at-top
  from runtime.workloads import mnist  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  images = rng.random((16384, 784), np.float32)
  labels = rng.integers(0, 10, 16384).astype(np.int32)
  # The MLP's matmuls, forward and backward, per example.
  sizes = (784, *config.model.hidden_sizes, 10)
  flops = 6.0 * sum(m * n for m, n in zip(sizes[:-1], sizes[1:]))
  return runtime.Task(params=mnist.init_params(config, 784),
                      loss_fn=mnist.loss_fn,
                      optimizer=optax.adam(config.optimizer.learning_rate),
                      data=runtime.ArraySource(image=images, label=labels),
                      flops_per_example=flops)


def _hand_step(task):
  """The step as one writes it by hand: jit, the state donated."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  @functools.partial(jax.jit, donate_argnums=0)
  def step(state, batch):
    params, opt_state = state
    (loss, _), grads = jax.value_and_grad(task.loss_fn, has_aux=True)(
        params, batch)
    updates, opt_state = task.optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss
  return step


def _host_batches(task, batch_size: int, count: int) -> list:
  """`count` batches of consecutive examples, numpy, as a hand-written loop
  slices them."""
  rows = len(task.data)
  out = []
  for i in range(count):
    start = (i * batch_size) % (rows - batch_size + 1)
    out.append(task.data.read_batch(range(start, start + batch_size)))
  return out


def _timed_loop(step, state, batches, place) -> tuple[float, object]:
  """Steps/s of steps 2..N (the first compiles); returns (rate, state)."""
  import jax  # pylint: disable=g-import-not-at-top
  state, loss = step(state, place(batches[0]))
  jax.block_until_ready(loss)
  started = time.perf_counter()
  for batch in batches[1:]:
    state, loss = step(state, place(batch))
  jax.block_until_ready((state, loss))
  return (len(batches) - 1) / (time.perf_counter() - started), state


class _Clock:
  """A podrun hook: the time from the end of the run's first step to the
  end of its last, and the steps between."""

  def begin(self, run):
    self.started = None

  def after_step(self, run):
    if run.count == 1:
      import jax  # pylint: disable=g-import-not-at-top
      jax.block_until_ready(run.state)
      self.started = time.perf_counter()

  def end(self, run, error):
    import jax  # pylint: disable=g-import-not-at-top
    jax.block_until_ready(run.state)
    self.rate = (run.count - 1) / (time.perf_counter() - self.started)


def _podrun(config, task, parallelism: str, workdir: str) -> float:
  import dataclasses  # pylint: disable=g-import-not-at-top
  from runtime import training  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  config.parallelism, config.checkpointing = parallelism, False
  clock = _Clock()
  training.train(config, workdir, dataclasses.replace(task, hooks=(clock,)))
  return clock.rate


def _measure(name: str, config, task, rounds: int, scratch: str) -> dict:
  """Every method, `rounds` times, alternating; medians and ratios."""
  import jax  # pylint: disable=g-import-not-at-top
  from runtime import flops  # pylint: disable=g-import-not-at-top
  batch_size = config.global_batch_size
  step = _hand_step(task)
  batches = _host_batches(task, batch_size, config.steps)
  device = jax.devices()[0]
  on_device = jax.device_put(batches[0], device)
  state = jax.device_put((task.params, task.optimizer.init(task.params)),
                         device)
  rates = {m: [] for m in METHODS}
  for r in range(rounds):
    order = METHODS[r % len(METHODS):] + METHODS[:r % len(METHODS)]
    for method in order:
      if method == 'hand':
        rate, state = _timed_loop(step, state, batches,
                                  lambda b: jax.device_put(b, device))
      elif method == 'on_device':
        rate, state = _timed_loop(step, state, [on_device] * len(batches),
                                  lambda b: b)
      else:
        rate = _podrun(config, task, method.split('_', 1)[1],
                       os.path.join(scratch, f'{name}_{method}_{r}'))
      rates[method].append(rate)
  median = {m: statistics.median(v) for m, v in rates.items()}
  figures = flops.Figures(device.device_kind, jax.device_count(),
                          lambda: None, batch_size,
                          workload_flops_per_example=task.flops_per_example)
  per_step = figures.step_flops()
  mfu = {m: figures.rates(median[m]).get('mfu') for m in METHODS}
  return {
      'steps_per_sec': median, 'rounds': rates,
      'hand_vs_on_device': median['hand'] / median['on_device'],
      'podrun_pmap_vs_hand': median['podrun_pmap'] / median['hand'],
      'podrun_shard_map_vs_hand': median['podrun_shard_map'] / median['hand'],
      'mfu': mfu, 'flops_per_step_per_device': per_step,
  }


def _hand_first_step(shape: str) -> None:
  """This process: the LM's one-step job written by hand; prints the
  seconds from the interpreter's start (compile included)."""
  import jax  # pylint: disable=g-import-not-at-top
  config = _lm_config(shape, 1)
  task = _lm_task(config)
  step = _hand_step(task)
  device = jax.devices()[0]
  state = jax.device_put((task.params, task.optimizer.init(task.params)),
                         device)
  batch = jax.device_put(task.data.read_batch(
      range(config.global_batch_size)), device)
  _, loss = step(state, batch)
  jax.block_until_ready(loss)
  print(json.dumps({'platform': device.platform}))


def _process_seconds(argv: list[str], env: dict) -> float:
  started = time.perf_counter()
  result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
  if result.returncode != 0:
    raise RuntimeError(f'{argv} exited {result.returncode}:\n'
                       f'{result.stderr[-3000:]}')
  return time.perf_counter() - started


def _first_steps(shape: str, scratch: str) -> dict:
  """A one-step LM job by the launcher and by hand, each a fresh process
  with a cold compilation cache; wall seconds, start to end."""
  env = {k: v for k, v in os.environ.items()
         if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')}
  env['PYTHONPATH'] = os.pathsep.join(
      [str(REPO)] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep)
                     if p])
  env.setdefault('JAX_NUM_CPU_DEVICES', '1')  # Only the CPU reads it.
  hand = _process_seconds([sys.executable, __file__, '--hand_first_step',
                           f'--shape={shape}'], env)
  launcher = _process_seconds(
      [sys.executable, '-m', 'launcher', f'--config=configs/decoder.py:{shape}',
       '--config.steps=1', '--config.checkpointing=False',
       f'--workdir={scratch}/first_step'], env)
  return {'launcher_s': launcher, 'hand_s': hand,
          'launcher_vs_hand': launcher / hand}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--shape', default='gpt2_small')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=40)
  parser.add_argument('--mnist_steps', type=int, default=300)
  parser.add_argument('--first_step', action=argparse.BooleanOptionalAction,
                      default=True)
  parser.add_argument('--hand_first_step', action='store_true')
  parser.add_argument('--out', default=None)
  args = parser.parse_args()
  if args.hand_first_step:
    _hand_first_step(args.shape)
    return
  with tempfile.TemporaryDirectory(prefix='podrun_chip_') as scratch:
    # Before this process touches the chip: one program at a time holds it.
    first = _first_steps(args.shape, scratch) if args.first_step else None
    import jax  # pylint: disable=g-import-not-at-top
    jax.config.update('jax_num_cpu_devices', 1)
    # podrun's step is a new function every run: the cache compiles it once.
    jax.config.update('jax_compilation_cache_dir', f'{scratch}/cache')
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
    device = jax.devices()[0]
    out = {'device_kind': device.device_kind, 'platform': device.platform,
           'jax': jax.__version__, 'shape': args.shape,
           'date': time.strftime('%Y-%m-%d'), 'first_step': first}
    config = _lm_config(args.shape, args.steps)
    out['lm'] = _measure('lm', config, _lm_task(config), args.rounds, scratch)
    config = _mnist_config(args.mnist_steps)
    out['mnist_mlp'] = _measure('mnist', config, _mnist_task(config),
                                args.rounds, scratch)
  _print_table(out)
  text = json.dumps(out, indent=1, default=str)
  print(text)
  if args.out:
    pathlib.Path(args.out).write_text(text)


def _print_table(out: dict) -> None:
  print(f'{out["device_kind"]} ({out["platform"]}), JAX {out["jax"]}')
  print('| workload | hand / on-device | podrun pmap / hand | podrun shard_map'
        ' / hand | MFU on-device, hand, pmap, shard_map |')
  for name in ('lm', 'mnist_mlp'):
    r = out[name]
    mfu = ', '.join('-' if r['mfu'][m] is None else f'{100 * r["mfu"][m]:.1f} %'
                    for m in ('on_device', 'hand', 'podrun_pmap',
                              'podrun_shard_map'))
    print(f'| {name} | {r["hand_vs_on_device"]:.3f} | '
          f'{r["podrun_pmap_vs_hand"]:.3f} | '
          f'{r["podrun_shard_map_vs_hand"]:.3f} | {mfu} |')
  if out['first_step']:
    f = out['first_step']
    print(f'one-step LM job, start to end: launcher {f["launcher_s"]:.1f} s, '
          f'hand-written {f["hand_s"]:.1f} s ({f["launcher_vs_hand"]:.2f}x)')


if __name__ == '__main__':
  main()
