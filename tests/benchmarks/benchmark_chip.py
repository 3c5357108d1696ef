"""The loop against the chip: podrun's runtime, a hand-written loop and the
step alone, side by side in one process, on whatever JAX sees.

  python tests/benchmarks/benchmark_chip.py [--shape=gpt2_small|tiny]
      [--rounds=3] [--steps=40] [--mnist_steps=300] [--out=chip.json]
      [--workload=lm|mnist|both] [--methods=hand,on_device,...]

Two workloads: the decoder LM of configs/decoder.py (default GPT-2 small's
shape, 124 M parameters, bf16 compute, AdamW, sequences of 512, batch 16;
`--shape=tiny` for a CPU) and the MNIST MLP of configs/mnist.py (784-512-
512-10, Adam, batch 256, synthetic digits). Each is run four ways, in an
order that turns by one every round:

- podrun_pmap, podrun_shard_map: `runtime.train` with its defaults
  (metrics every config.log_every steps, TensorBoard, the replica check,
  prefetch, steps_per_dispatch auto), but checkpoints off;
- podrun_pmap_k1: the same with one step per call;
- hand: `jax.jit` of the same step with the state donated, each batch cut
  from host memory and `jax.device_put`, no block until the end;
- on_device: that step on one batch already on the device;
- resident_scan: 25 of those steps in one `lax.scan` over batches already on
  the device, the limit of a small step's program.

Each run's speed counts the steps after the first WARM_STEPS (compilation,
and auto's measurement), to the end of step N; a figure is the median over
the rounds. `--mode=checkpoints` times instead the LM's whole run of --steps
with each checkpoint setting, against none. MFU is
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
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

METHODS = ('podrun_pmap', 'podrun_shard_map', 'podrun_pmap_k1', 'hand',
           'on_device', 'resident_scan')
# Steps of the resident scan's one call.
RESIDENT_STEPS = 25
# Steps each way runs before its clock starts: the first compiles, and
# podrun's auto steps_per_dispatch measures 20 steps before it chooses.
WARM_STEPS = 40


def _lm_config(shape: str, steps: int):
  from configs import decoder  # pylint: disable=g-import-not-at-top
  config = decoder.get_config(shape)
  config.steps = steps
  return config


def _mnist_config(steps: int, hidden: tuple[int, ...] = ()):
  from configs import mnist  # pylint: disable=g-import-not-at-top
  config = mnist.get_config()
  config.steps, config.eval_every = steps, 0
  if hidden:
    config.model.hidden_sizes = hidden
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
    (loss, _), grads = jax.value_and_grad(task.loss_fn, has_aux=True)(params,
                                                                      batch)
    updates, opt_state = task.optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  return step


def _resident_scan(task, batches: list, calls: int) -> float:
  """Steps/s of the limit of a small step's program: RESIDENT_STEPS steps
  of the hand-written step in one `lax.scan`, over batches already on the
  device, the state donated; `calls` calls timed after one that compiles."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  def one(state, batch):
    params, opt_state = state
    (loss, _), grads = jax.value_and_grad(task.loss_fn, has_aux=True)(params,
                                                                      batch)
    updates, opt_state = task.optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  @functools.partial(jax.jit, donate_argnums=0)
  def call(state, stacked):
    return jax.lax.scan(one, state, stacked)

  device = jax.devices()[0]
  per_call = min(RESIDENT_STEPS, len(batches))
  stacked = jax.device_put(
      jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *batches[:per_call]),
      device)
  state = jax.device_put((task.params, task.optimizer.init(task.params)),
                         device)
  state, losses = call(state, stacked)
  jax.block_until_ready(losses)
  started = time.perf_counter()
  for _ in range(calls):
    state, losses = call(state, stacked)
  jax.block_until_ready((state, losses))
  rate = calls * per_call / (time.perf_counter() - started)
  jax.tree_util.tree_map(lambda x: x.delete(), state)
  return rate


def _host_batches(task, batch_size: int, count: int) -> list:
  """`count` batches of consecutive examples, numpy, as a hand-written loop
  slices them; at most 64 distinct ones, taken in turn (host memory)."""
  rows = len(task.data)
  distinct = []
  for i in range(min(count, 64)):
    start = (i * batch_size) % (rows - batch_size + 1)
    distinct.append(task.data.read_batch(range(start, start + batch_size)))
  return [distinct[i % len(distinct)] for i in range(count)]


def _timed_loop(step, state, batches, place) -> tuple[float, object]:
  """Steps/s after the first WARM_STEPS; returns (rate, state)."""
  import jax  # pylint: disable=g-import-not-at-top
  warm = min(WARM_STEPS, len(batches) - 1)
  for batch in batches[:warm]:
    state, loss = step(state, place(batch))
  jax.block_until_ready(loss)
  started = time.perf_counter()
  for batch in batches[warm:]:
    state, loss = step(state, place(batch))
  jax.block_until_ready((state, loss))
  return (len(batches) - warm) / (time.perf_counter() - started), state


def _clock(warm: int = WARM_STEPS, stop: int = 0):
  """A podrun hook: the time from the end of the first call that reaches
  `warm` steps to the end of the last (`rate`), and to the end of the first
  call that reaches step `stop` (`last_rate`: the task's hooks run after
  the built-in ones, so the final step's includes the final save's wait).
  `steady_rate` counts from the end of the first call of the run's last
  size of call (auto's k, once it stops growing): without the compilations
  of the sizes before, which a run pays once (and the compilation cache
  saves the next). Periodic with no period: it asks for no step of its
  own, so auto steps_per_dispatch may choose any."""
  from runtime import hooks  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  class Clock(hooks.Periodic):

    def __init__(self):
      super().__init__(every=0)
      self.started = None
      self.steady_started, self._seen, self._size = None, 0, 0

    def after_step(self, run):
      size, self._seen = run.count - self._seen, run.count
      if size != self._size and run.step < run.steps:
        jax.block_until_ready(run.state)  # Rare: when the size changes.
        self._size = size
        self.steady_started, self.steady_count = (time.perf_counter(),
                                                  run.count)
      if self.started is None and run.count >= min(warm, run.steps - 1):
        jax.block_until_ready(run.state)
        self.started, self.count = time.perf_counter(), run.count
      elif (self.started is not None and run.step >= (stop or run.steps) and
            not hasattr(self, 'last_rate')):
        jax.block_until_ready(run.state)
        self.last_rate = ((run.count - self.count) /
                          (time.perf_counter() - self.started))

    def end(self, run, error):
      if error is not None:
        return
      jax.block_until_ready(run.state)
      now = time.perf_counter()
      self.rate = (run.count - self.count) / (now - self.started)
      self.steady_rate = ((run.count - self.steady_count) /
                          (now - self.steady_started))

  return Clock()


def _podrun(config, task, parallelism: str, workdir: str, **overrides) -> float:
  import dataclasses  # pylint: disable=g-import-not-at-top
  import gc  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from runtime import training  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  config.parallelism, config.checkpointing = parallelism, False
  config.update_from_flattened_dict(overrides)
  clock = _clock()
  training.train(config, workdir, dataclasses.replace(task, hooks=(clock,)))
  # Each run's step is a new function: its loaded program would stay, and
  # a TPU reserves a loaded program's memory (three of the LM's do not fit).
  jax.clear_caches()
  gc.collect()
  return clock.rate, clock.steady_rate


def _measure(name: str, config, task, rounds: int, scratch: str,
             methods: tuple[str, ...], partial) -> dict:
  """Each of `methods`, `rounds` times, alternating; medians and ratios.
  `partial(rates)` is called after every run, so a run cut short still
  leaves what it measured."""
  import jax  # pylint: disable=g-import-not-at-top
  from runtime import flops  # pylint: disable=g-import-not-at-top
  batch_size = config.global_batch_size
  step = _hand_step(task)
  batches = _host_batches(task, batch_size, config.steps)
  device = jax.devices()[0]
  on_device = jax.device_put(batches[0], device)
  rates = {m: [] for m in methods}
  # podrun's runs counted from their last size of call on (`_clock`).
  steady, steady_rounds = {}, {}
  for r in range(rounds):
    order = methods[r % len(methods):] + methods[:r % len(methods)]
    for method in order:
      if method == 'resident_scan':
        rate = _resident_scan(task, batches,
                              max(1, config.steps // RESIDENT_STEPS))
      elif method in ('hand', 'on_device'):
        # Placed for this run alone: podrun's runs get the chip's memory.
        state = jax.device_put((task.params, task.optimizer.init(task.params)),
                               device)
        if method == 'hand':
          rate, state = _timed_loop(step, state, batches,
                                    lambda b: jax.device_put(b, device))
        else:
          rate, state = _timed_loop(step, state, [on_device] * len(batches),
                                    lambda b: b)
        jax.tree_util.tree_map(lambda x: x.delete(), state)
        del state
      else:
        way = method.removeprefix('podrun_')
        data_on_device = way.endswith('_on_device')
        parallelism, _, k = way.removesuffix('_on_device').partition('_k')
        overrides = {'steps_per_dispatch': int(k)} if k else {}
        if data_on_device:
          overrides['data.on_device'] = True
        rate, steady[method] = _podrun(
            config, task, parallelism,
            os.path.join(scratch, f'{name}_{method}_{r}'), **overrides)
        steady_rounds.setdefault(method, []).append(steady[method])
      rates[method].append(rate)
      partial({'rounds': rates, 'steady_rounds': steady_rounds})
  median = {m: statistics.median(v) for m, v in rates.items()}
  steady = {m: statistics.median(v) for m, v in steady_rounds.items()}
  figures = flops.Figures(device.device_kind,
                          jax.device_count(),
                          lambda: None,
                          batch_size,
                          workload_flops_per_example=task.flops_per_example)
  per_step = figures.step_flops()
  mfu = {m: figures.rates(median[m]).get('mfu') for m in methods}
  ratios = {
      f'{a}_vs_{b}': median[a] / median[b]
      for a, b in (('hand', 'on_device'), ('podrun_pmap', 'hand'),
                   ('podrun_shard_map', 'hand'), ('podrun_pmap_k1', 'hand'),
                   ('podrun_pmap', 'on_device'), ('podrun_shard_map',
                                                  'on_device'),
                   ('podrun_pmap', 'resident_scan'), ('hand', 'resident_scan'))
      if a in median and b in median
  }
  ratios.update({
      f'{m}_steady_vs_resident_scan': v / median['resident_scan']
      for m, v in steady.items()
      if 'resident_scan' in median
  })
  return {
      'steps_per_sec': median,
      'rounds': rates,
      **ratios, 'mfu': mfu,
      'steady_steps_per_sec': steady,
      'steady_rounds': steady_rounds,
      'flops_per_step_per_device': per_step
  }


# One default changed at a time, then all four: which costs what.
ABLATIONS = {
    'defaults': {},
    'in_flight_4': {
        'max_steps_in_flight': 4
    },
    'log_every_1000': {
        'log_every': 1000
    },
    'no_tensorboard': {
        'tensorboard': False
    },
    'no_integrity': {
        'integrity_every': 0
    },
    'all_four': {
        'max_steps_in_flight': 4,
        'log_every': 1000,
        'tensorboard': False,
        'integrity_every': 0
    },
}


def _host_parts():
  """Patches the loop's parts with timers; returns {part: seconds}."""
  import collections  # pylint: disable=g-import-not-at-top
  from runtime import hooks, integrity, loop, prefetch  # pylint: disable=g-import-not-at-top
  spent = collections.defaultdict(float)

  def timed(owner, name, part):
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
      started = time.perf_counter()
      try:
        return inner(*args, **kwargs)
      finally:
        spent[part] += time.perf_counter() - started

    setattr(owner, name, wrapper)

  timed(loop.Run, '_retire', 'retire (metrics to host)')
  timed(loop.Run, 'dispatched', 'dispatched (incl. retire)')
  timed(prefetch.Prefetcher, 'next', 'next batch')
  for cls in (hooks.LogMetrics, hooks.PreemptionAgreement,
              integrity.CheckReplicas):
    timed(cls, 'after_step', cls.__name__)
  return spent


def _ablation(config, task, rounds: int, scratch: str) -> dict:
  """podrun pmap with each ablation, against the hand-written loop, rounds
  alternating; plus where the host's time goes with the defaults."""
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  step = _hand_step(task)
  batches = _host_batches(task, config.global_batch_size, config.steps)
  names = ('hand',) + tuple(ABLATIONS)
  rates = {n: [] for n in names}
  for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
      if name == 'hand':
        state = jax.device_put((task.params, task.optimizer.init(task.params)),
                               device)
        rate, state = _timed_loop(step, state, batches,
                                  lambda b: jax.device_put(b, device))
        jax.tree_util.tree_map(lambda x: x.delete(), state)
      else:
        rate, _ = _podrun(config, task, 'pmap',
                          os.path.join(scratch, f'ablate_{name}_{r}'),
                          **ABLATIONS[name])
      rates[name].append(rate)
  median = {n: statistics.median(v) for n, v in rates.items()}
  spent = _host_parts()
  started = time.perf_counter()
  _podrun(config, task, 'pmap', os.path.join(scratch, 'ablate_parts'))
  wall = time.perf_counter() - started
  return {
      'vs_hand': {
          n: median[n] / median['hand'] for n in names
      },
      'steps_per_sec': median,
      'rounds': rates,
      'host_seconds_per_step': {
          k: v / config.steps for k, v in spent.items()
      },
      'wall_s_with_parts': wall
  }


CHECKPOINTS = {
    'none': {
        'checkpointing': False
    },
    'final_only': {
        'checkpoint_every': 0,
        'local_checkpoint_every': 0
    },
    'defaults': {},
    # The local tier's default before issue 71.
    'local_every_25': {
        'checkpoint_every': 0,
        'local_checkpoint_every': 25
    },
    'persistent_every_10': {
        'checkpoint_every': 10,
        'local_checkpoint_every': 0
    },
}


def _checkpoint_table(config, task, rounds: int, scratch: str,
                      settings: tuple[str, ...], partial) -> dict:
  """With each checkpoint setting (a fresh workdir each time), rounds
  alternating: the seconds of the whole `train` (the final save included)
  and the loop's steps/s after WARM_STEPS to the step before the last (the
  saves between included, not the final one); medians and each against
  none."""
  from runtime import training  # pylint: disable=g-import-not-at-top
  import dataclasses  # pylint: disable=g-import-not-at-top
  import gc  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  seconds = {name: [] for name in settings}
  loop_rates = {name: [] for name in settings}
  for r in range(-1, rounds):  # Round -1 compiles for the cache.
    names = list(settings) if r >= 0 else ['none']
    for name in names[r % len(names):] + names[:r % len(names)]:
      run_config = config.copy_and_resolve_references()
      run_config.parallelism = 'pmap'
      run_config.update(CHECKPOINTS[name])
      clock = _clock(stop=run_config.steps - 1)
      started = time.perf_counter()
      training.train(run_config, os.path.join(scratch, f'ckpt_{name}_{r}'),
                     dataclasses.replace(task, hooks=(clock,)))
      jax.clear_caches()  # As in _podrun: loaded programs hold memory.
      gc.collect()
      if r >= 0:
        seconds[name].append(time.perf_counter() - started)
        loop_rates[name].append(clock.last_rate)
        partial({'seconds': seconds, 'loop_steps_per_sec': loop_rates})
  median = {n: statistics.median(v) for n, v in seconds.items()}
  loop = {n: statistics.median(v) for n, v in loop_rates.items()}
  return {
      'seconds': median,
      'rounds': seconds,
      'vs_none': {
          n: median[n] / median['none'] for n in median
      },
      'loop_steps_per_sec': loop,
      'loop_rounds': loop_rates,
      'loop_time_vs_none': {
          n: loop['none'] / loop[n] for n in loop
      }
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
  batch = jax.device_put(task.data.read_batch(range(config.global_batch_size)),
                         device)
  _, loss = step(state, batch)
  jax.block_until_ready(loss)
  print(json.dumps({'platform': device.platform}))


def _process_seconds(argv: list[str], env: dict) -> float:
  started = time.perf_counter()
  result = subprocess.run(argv,
                          cwd=REPO,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=900,
                          check=False)
  if result.returncode != 0:
    raise RuntimeError(f'{argv} exited {result.returncode}:\n'
                       f'{result.stderr[-3000:]}')
  return time.perf_counter() - started


def _first_steps(shape: str, scratch: str) -> dict:
  """A one-step LM job by the launcher and by hand, each a fresh process
  with a cold compilation cache; wall seconds, start to end."""
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')
  }
  env['PYTHONPATH'] = os.pathsep.join(
      [str(REPO)] +
      [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
  env.setdefault('JAX_NUM_CPU_DEVICES', '1')  # Only the CPU reads it.
  hand = _process_seconds(
      [sys.executable, __file__, '--hand_first_step', f'--shape={shape}'], env)
  launcher = _process_seconds([
      sys.executable, '-m', 'launcher', f'--config=configs/decoder.py:{shape}',
      '--config.steps=1', '--config.checkpointing=False',
      f'--workdir={scratch}/first_step'
  ], env)
  return {
      'launcher_s': launcher,
      'hand_s': hand,
      'launcher_vs_hand': launcher / hand
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--shape', default='gpt2_small')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=40)
  parser.add_argument('--mnist_steps', type=int, default=300)
  parser.add_argument(
      '--mnist_hidden',
      default='',
      help='the MLP\'s hidden sizes, e.g. 8,8: a step with next to no '
      'compute, where the host\'s work per step is the whole cost (a CPU '
      'proxy of a small step on a chip)')
  parser.add_argument('--first_step',
                      action=argparse.BooleanOptionalAction,
                      default=True)
  parser.add_argument('--hand_first_step', action='store_true')
  parser.add_argument(
      '--mode',
      choices=('loop', 'ablate', 'checkpoints', 'fault'),
      default='loop',
      help='loop: every way of running the step; ablate: podrun with one '
      'default changed at a time; checkpoints: the LM with each checkpoint '
      'setting; fault: the LM SIGKILLed and restarted (tests/benchmarks/'
      'fault.py)')
  parser.add_argument('--kills',
                      type=int,
                      default=3,
                      help='--mode=fault: rounds of kill and restart')
  parser.add_argument('--seed',
                      type=int,
                      default=0,
                      help='--mode=fault: draws the steps killed at')
  parser.add_argument('--kill_steps',
                      default='200,1000',
                      help='--mode=fault: LOW,HIGH, the range drawn from')
  parser.add_argument('--fault_steps',
                      type=int,
                      default=1200,
                      help='--mode=fault: config.steps of the job killed')
  parser.add_argument('--clean_steps',
                      type=int,
                      default=300,
                      help='--mode=fault: then this many steps to the end, '
                      'with checkpoints at their defaults and with none '
                      '(0: not)')
  parser.add_argument('--workload',
                      choices=('lm', 'mnist', 'both'),
                      default='both')
  parser.add_argument('--methods',
                      default=','.join(METHODS),
                      help='comma-separated, of ' + ', '.join(METHODS))
  parser.add_argument('--checkpoints',
                      default='none,final_only,defaults',
                      help='--mode=checkpoints: comma-separated, of ' +
                      ', '.join(CHECKPOINTS))
  parser.add_argument('--out',
                      default=None,
                      help='JSON written after every run, whole or partial')
  args = parser.parse_args()
  if args.hand_first_step:
    _hand_first_step(args.shape)
    return
  methods = tuple(args.methods.split(','))
  hidden = tuple(int(n) for n in args.mnist_hidden.split(',') if n)
  # Beside METHODS, podrun_pmap_kN and podrun_shard_map_kN: N steps a call;
  # a suffix _on_device keeps the data set on the devices
  # (config.data.on_device).
  unknown = {
      m for m in methods if m not in METHODS and
      not re.fullmatch(r'podrun_(pmap|shard_map)(_k[0-9]+)?(_on_device)?', m)
  }
  if unknown:
    parser.error(f'--methods: {sorted(unknown)} are none of {METHODS}')
  out = {}

  def write(key, value):
    out[key] = value
    if args.out:
      pathlib.Path(args.out).write_text(json.dumps(out, indent=1, default=str))

  if args.mode == 'fault':  # Launcher processes only: this one never
    from tests.benchmarks import fault  # pylint: disable=g-import-not-at-top
    low, high = (int(n) for n in args.kill_steps.split(','))
    with tempfile.TemporaryDirectory(prefix='podrun_fault_') as scratch:
      try:
        result = fault.run(args.shape, scratch, args.kills, args.seed, low,
                           high, args.fault_steps)
        if args.clean_steps:
          result['clean'] = fault.clean_runs(args.shape, scratch,
                                             args.clean_steps)
      finally:  # The launchers' logs beside --out.
        if args.out:
          for log in pathlib.Path(scratch).glob('*.log'):
            shutil.copy(log, pathlib.Path(args.out).parent / log.name)
    write('fault', result)
    print(fault.describe(result))
    print(json.dumps(out, indent=1, default=str))
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
    out.update(device_kind=device.device_kind,
               platform=device.platform,
               jax=jax.__version__,
               shape=args.shape,
               date=time.strftime('%Y-%m-%d'),
               first_step=first)
    lm = args.workload in ('lm', 'both')
    mnist = args.workload in ('mnist', 'both')
    config = _lm_config(args.shape, args.steps)
    if args.mode == 'checkpoints':
      write(
          'lm_checkpoints',
          _checkpoint_table(config, _lm_task(config), args.rounds, scratch,
                            tuple(args.checkpoints.split(',')),
                            functools.partial(write, 'lm_checkpoints')))
    elif args.mode == 'ablate':
      if lm:
        write('lm_ablation',
              _ablation(config, _lm_task(config), args.rounds, scratch))
      if mnist:
        config = _mnist_config(args.mnist_steps, hidden)
        write('mnist_ablation',
              _ablation(config, _mnist_task(config), args.rounds, scratch))
    else:
      if lm:
        write(
            'lm',
            _measure('lm', config, _lm_task(config), args.rounds, scratch,
                     methods, functools.partial(write, 'lm')))
      if mnist:
        config = _mnist_config(args.mnist_steps, hidden)
        write(
            'mnist_mlp',
            _measure('mnist', config, _mnist_task(config), args.rounds, scratch,
                     methods, functools.partial(write, 'mnist_mlp')))
  if args.mode == 'loop':
    _print_table(out)
  print(json.dumps(out, indent=1, default=str))


def _print_table(out: dict) -> None:
  print(f'{out["device_kind"]} ({out["platform"]}), JAX {out["jax"]}')
  ratios = ('hand_vs_on_device', 'podrun_pmap_vs_hand',
            'podrun_shard_map_vs_hand', 'podrun_pmap_k1_vs_hand',
            'podrun_pmap_vs_on_device')
  print('| workload | ' + ' | '.join(r.replace('_vs_', ' / ') for r in ratios) +
        ' | MFU |')
  for name in ('lm', 'mnist_mlp'):
    if name not in out:
      continue
    r = out[name]
    mfu = ', '.join(
        f'{m} {100 * v:.1f} %' for m, v in r['mfu'].items() if v is not None)
    cells = ' | '.join(f'{r[k]:.3f}' if k in r else '-' for k in ratios)
    print(f'| {name} | {cells} | {mfu} |')
  if out['first_step']:
    f = out['first_step']
    print(f'one-step LM job, start to end: launcher {f["launcher_s"]:.1f} s, '
          f'hand-written {f["hand_s"]:.1f} s ({f["launcher_vs_hand"]:.2f}x)')


if __name__ == '__main__':
  main()
