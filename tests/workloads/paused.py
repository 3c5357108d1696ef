"""The linear regression with the pauses a real loop has: every 400th step
a hook compiles a program of its own (as a new steps-per-call size or a
first evaluation does: 0.3-0.5 s on a TPU v5e), and config's checkpoints
block the loop. tests/test_step_lines_processes.py reads its step lines."""

import dataclasses

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

import runtime
from runtime.workloads import linear_regression

COMPILE_EVERY = 400


def _compile_something_new(run) -> None:
  # A fresh function each time: a new program, compiled in the loop.
  offset = float(run.step)
  x = jnp.ones((64, 64))
  program = jax.jit(
      lambda x: sum(jnp.tanh(x @ x + offset + i) for i in range(150)))
  program(x).block_until_ready()


def train_and_evaluate(config: ConfigDict, workdir: str) -> runtime.TrainResult:
  task, _ = linear_regression.make_task(config)
  hook = runtime.hooks.Periodic(every=COMPILE_EVERY,
                                callback=_compile_something_new)
  return runtime.train(config, workdir, dataclasses.replace(task,
                                                            hooks=(hook,)))
