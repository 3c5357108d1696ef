"""Agreement before step 1: every process of a job runs the same thing.

A host with a stale checkout, another jax or libtpu, a `--config.x` given to
one host only or other XLA flags makes a pod hang or drift apart in silence.
So before the first step every process publishes a digest of what decides
its computation, through the coordination service; process 0 compares them
and every process stops, with exit 3, on any difference. The message has one
line per differing field, naming the ranks on each side and both values:

  config.optimizer.learning_rate: ranks 0-2 0.001, rank 3 0.5

Twice per job: `describe_process` at join time (config, code, versions,
environment), then `check_program_on_first_call` for the lowered step
program, once the first batch gives its shapes.

What is per process by design, and left out: `config.data_dir`,
`config.checkpoint_dir` and `config.local_checkpoint_dir` (hosts may mount the same storage at different
paths; the checkpoint directory is checked to be shared separately), and
every variable outside `PROGRAM_ENV`.

Example:
  >>> agree(coordination.current(), describe_process(config.to_dict()),
  ...       'join')
"""

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import time
from typing import Any, Callable, Mapping, Optional

from absl import logging

from runtime.common import exit_codes
from runtime.common import mappings
from runtime import coordination

# Config fields that may differ between processes: local paths.
PER_PROCESS_CONFIG = ('data_dir', 'checkpoint_dir', 'local_checkpoint_dir')
# The packages whose versions change what a step computes.
PACKAGES = ('jax', 'jaxlib', 'libtpu', 'jax-cuda12-plugin', 'jax-cuda12-pjrt',
            'jax-cuda13-plugin', 'jax-cuda13-pjrt', 'flax', 'optax',
            'orbax-checkpoint', 'numpy')
# Environment variables that change the programs JAX builds.
PROGRAM_ENV = ('XLA_FLAGS', 'LIBTPU_INIT_ARGS', 'JAX_ENABLE_X64',
               'JAX_DEFAULT_MATMUL_PRECISION', 'JAX_DEFAULT_DTYPE_BITS',
               'JAX_NUMPY_DTYPE_PROMOTION', 'JAX_NUMPY_RANK_PROMOTION',
               'JAX_THREEFRY_PARTITIONABLE', 'JAX_DEFAULT_PRNG_IMPL',
               'JAX_ENABLE_CHECKS', 'JAX_DEBUG_NANS', 'JAX_PLATFORMS',
               'JAX_OPTIMIZATION_LEVEL', 'CUDA_DEVICE_MAX_CONNECTIONS',
               'XLA_CLIENT_MEM_FRACTION')
# The project's own code, hashed file by file.
CODE_PACKAGES = ('launcher', 'runtime', 'configs')
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_KEY = 'podrun/agreement'


class DisagreementError(exit_codes.PodrunError):
  """The processes of the job do not run the same thing (exit 3, as a
  topology mismatch, under the name PROCESSES_DIFFER)."""
  exit_code = exit_codes.PROCESSES_DIFFER


def config_fields(values: Mapping[str, Any]) -> dict[str, str]:
  """{'config.a.b': value as JSON} for every field of `values` (a config's
  `to_dict()`), less PER_PROCESS_CONFIG."""
  values = {k: v for k, v in values.items() if k not in PER_PROCESS_CONFIG}
  return {
      field: json.dumps(value, sort_keys=True, default=repr)
      for field, value in mappings.flatten(values, 'config').items()
  }


def code_hash(root: str = _REPO, packages=CODE_PACKAGES) -> str:
  """sha256 over the path and bytes of every .py file of `packages`."""
  digest = hashlib.sha256()
  for package in packages:
    for directory, dirs, names in sorted(os.walk(os.path.join(root, package))):
      dirs.sort()
      for name in sorted(n for n in names if n.endswith('.py')):
        path = os.path.join(directory, name)
        digest.update(os.path.relpath(path, root).encode() + b'\0')
        with open(path, 'rb') as f:
          digest.update(f.read())
  return digest.hexdigest()[:16]


def _workload_hash(spec: Optional[str]) -> str:
  """sha256 of the file of the module config.workload names, if found."""
  module = str(spec or '').partition(':')[0]
  try:
    found = importlib.util.find_spec(module) if module else None
  except (ImportError, ValueError):
    found = None
  if found is None or not found.origin or not os.path.isfile(found.origin):
    return 'not found'
  with open(found.origin, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()[:16]


def _version(package: str) -> str:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return 'absent'


def describe_process(values: Mapping[str, Any]) -> dict[str, str]:
  """What decides this process's computation, field by field.

  Args:
    values: the job's config as plain values (`config.to_dict()`): every
      field is compared, so none is read for a decision here.

  Returns:
    {field: value}: `config.*`, `code.podrun`, `code.workload`,
    `version.python` and `version.<package>`, `env.<variable>`.
  """
  fields = config_fields(values)
  fields['code.podrun'] = code_hash()
  fields['code.workload'] = _workload_hash(values.get('workload'))
  fields['version.python'] = platform.python_version()
  fields.update({f'version.{p}': _version(p) for p in PACKAGES})
  fields.update({f'env.{v}': os.environ.get(v, '') for v in PROGRAM_ENV})
  return fields


def _ranks(indices: list[int]) -> str:
  """The console's words for sorted process indices: 'rank 3', 'ranks 0-2',
  'ranks 0, 2, 5-7'."""
  parts, start = [], None
  for i, index in enumerate(indices):
    if start is None:
      start = index
    if i + 1 == len(indices) or indices[i + 1] != index + 1:
      parts.append(str(start) if start == index else f'{start}-{index}')
      start = None
  return ('rank ' if len(indices) == 1 else 'ranks ') + ', '.join(parts)


def differences(digests: Mapping[int, Mapping[str, str]]) -> list[str]:
  """One line per field on which the processes disagree.

  Args:
    digests: {process index: {field: value}}.

  Returns:
    e.g. ['config.optimizer.learning_rate: ranks 0-2 0.001, rank 3 0.5'];
    a field one process lacks counts as '(missing)'.
  """
  fields = sorted(set().union(*digests.values())) if digests else []
  lines = []
  for field in fields:
    by_value: dict[str, list[int]] = {}
    for process_index in sorted(digests):
      value = digests[process_index].get(field, '(missing)')
      by_value.setdefault(value, []).append(process_index)
    if len(by_value) > 1:
      sides = sorted(by_value.items(), key=lambda item: item[1][0])
      lines.append(f'{field}: ' +
                   ', '.join(f'{_ranks(indices)} {value or "(unset)"}'
                             for value, indices in sides))
  return lines


def agree(client: Optional[coordination.Client],
          fields: Mapping[str, str],
          stage: str,
          timeout_s: Optional[float] = None) -> None:
  """Publishes this process's fields; process 0 compares every process's.

  Args:
    client: the coordination service, or None for a single process (no-op).
    fields: from `describe_process`, or the program's fingerprint.
    stage: names this round ('join', 'program').
    timeout_s: how long to wait for the others; --barrier_timeout if None.

  Raises:
    DisagreementError: on every process, naming each differing field.
    coordination.BarrierTimeout: a process did not publish in time.
  """
  if client is None or client.process_count == 1:
    return
  key = f'{_KEY}/{stage}'
  verdict = client.decide_on_0(key, json.dumps(dict(fields)),
                               lambda published: _verdict(stage, published),
                               timeout_s)
  if verdict != 'ok':
    raise DisagreementError(verdict)


def _verdict(stage: str, published: Mapping[int, str]) -> str:
  """Process 0: 'ok', or the message every process stops with."""
  digests = {i: json.loads(text) for i, text in published.items()}
  lines = differences(digests)
  if not lines:
    logging.info(
        'agreement (%s): the %d processes run the same thing (%d '
        'field(s) compared)', stage, len(digests), len(digests[0]))
    return 'ok'
  return (f'processes differ: the {len(digests)} processes of this job do '
          f'not run the same thing ({len(lines)} difference(s)); nothing was '
          'trained:\n'
          '  - ' + '\n  - '.join(lines) + '\nStart every process from the '
          'same code, packages, flags and environment.')


def check_program_on_first_call(step_fn: Callable,
                                client: Optional[coordination.Client],
                                stage: str = 'program') -> Callable:
  """`step_fn` that, before its first run, agrees on its lowered program.

  The first call lowers the step for its arguments (StableHLO, without
  source locations) and compares a hash of it across processes; later calls
  go straight through.
  """
  if client is None or client.process_count == 1:
    return step_fn
  agreed: list[float] = []

  def call(*args):
    if not agreed:
      started = time.perf_counter()
      text = step_fn.lower(*args).as_text(debug_info=False)
      agree(client, {
          'program.train_step': hashlib.sha256(text.encode()).hexdigest()[:16]
      }, stage)
      agreed.append(time.perf_counter() - started)
      logging.info('the step program, lowered and compared in %.2f s',
                   agreed[0])
    return step_fn(*args)

  return call
