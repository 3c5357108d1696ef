"""Every exit code podrun gives, and the error classes that carry them.

One table for the whole project: an error that ends a process is a
`PodrunError` whose class (or instance) names its `exit_code`, so the process
that catches it never needs a list of error types. Nothing here imports JAX;
runtime/ and launcher/ both reach it (runtime/common/).

A rank's own exit code passes through unchanged: the launcher exits with the
code of the rank that failed first, and 128 + N when that rank was killed by
signal N, as a shell reports it.

Example:
  >>> raise PodrunError('the data bucket is gone', exit_code=42)  # a workload
  >>> code_of(ConfigError('config.steps must be positive'))
  <ExitCode.CONFIG_ERROR: 2>
"""

import enum
import signal
from typing import Optional, Sequence


class ExitCode(enum.IntEnum):
  """podrun's exit codes; `meaning` is docs/reference/exit-codes.md's line for each."""
  OK = 0
  FAILED = 1
  CONFIG_ERROR = 2
  TOPOLOGY_MISMATCH = 3
  # The same number (schedulers' policies read it), for the other cause:
  # the processes run different code, packages, config or programs.
  PROCESSES_DIFFER = 3
  DISTRIBUTED_INIT_FAILED = 4
  CHECKPOINT_ERROR = 5
  POD_UNAVAILABLE = 6
  PEER_FAILED = 10
  WORKDIR_BUSY = 11
  REPLICAS_DIVERGED = 12
  PREEMPTED = 75
  STALLED = 124

  @property
  def meaning(self) -> str:
    return _MEANINGS[self]


_MEANINGS = {
    ExitCode.OK: 'success',
    ExitCode.FAILED: 'an uncaught exception in the workload',
    ExitCode.CONFIG_ERROR: 'a bad config, flag or workload name, or a batch '
                           'that does not fit the devices',
    ExitCode.TOPOLOGY_MISMATCH: 'TOPOLOGY_MISMATCH: the pod that joined is '
                                'not the one the config or flags describe; '
                                'or PROCESSES_DIFFER: its processes do not '
                                'run the same thing',
    ExitCode.DISTRIBUTED_INIT_FAILED: 'jax.distributed could not start',
    ExitCode.CHECKPOINT_ERROR: 'a checkpoint that does not fit the run, or a '
                               'checkpoint directory not every process sees',
    ExitCode.POD_UNAVAILABLE: 'the TPU pod is not READY and HEALTHY, cannot '
                              'be read, or is preempted',
    ExitCode.PEER_FAILED: 'another process of the job failed first',
    ExitCode.WORKDIR_BUSY: 'another job holds the workdir or the pod',
    ExitCode.REPLICAS_DIVERGED: 'the replicas\' parameters diverged',
    ExitCode.PREEMPTED: 'preempted: every process saved the same step',
    ExitCode.STALLED: 'the hang watchdog fired, or a cross-process wait timed '
                      'out',
}

# `exit_codes.PREEMPTED` is `ExitCode.PREEMPTED`, spelled out so that grep
# and linters see every name.
OK = ExitCode.OK
FAILED = ExitCode.FAILED
CONFIG_ERROR = ExitCode.CONFIG_ERROR
TOPOLOGY_MISMATCH = ExitCode.TOPOLOGY_MISMATCH
PROCESSES_DIFFER = ExitCode.PROCESSES_DIFFER
DISTRIBUTED_INIT_FAILED = ExitCode.DISTRIBUTED_INIT_FAILED
CHECKPOINT_ERROR = ExitCode.CHECKPOINT_ERROR
POD_UNAVAILABLE = ExitCode.POD_UNAVAILABLE
PEER_FAILED = ExitCode.PEER_FAILED
WORKDIR_BUSY = ExitCode.WORKDIR_BUSY
REPLICAS_DIVERGED = ExitCode.REPLICAS_DIVERGED
PREEMPTED = ExitCode.PREEMPTED
STALLED = ExitCode.STALLED

# 128 + N: the launcher got signal N, or a rank died of it (as a shell says).
SIGNAL_BASE = 128

# A user's own mistake: the same run fails the same way again.
NEVER_RETRIED = (ExitCode.OK, ExitCode.FAILED, ExitCode.CONFIG_ERROR,
                 ExitCode.TOPOLOGY_MISMATCH, ExitCode.CHECKPOINT_ERROR,
                 ExitCode.WORKDIR_BUSY)

# Faults every process of a job finds by itself (the same config, the same
# pod, the same checkpoint): each keeps its own code rather than PEER_FAILED.
SAME_EVERYWHERE = (ExitCode.CONFIG_ERROR, ExitCode.TOPOLOGY_MISMATCH,
                   ExitCode.DISTRIBUTED_INIT_FAILED, ExitCode.CHECKPOINT_ERROR,
                   ExitCode.WORKDIR_BUSY, ExitCode.REPLICAS_DIVERGED,
                   ExitCode.STALLED)


class PodrunError(Exception):
  """An error that ends a process with a chosen exit code.

  Subclasses set `exit_code`; a workload may raise this class itself with
  `exit_code=N` to end its job with N (for example 42, which xpk restarts).

  Attributes:
    exit_code: what the process exits with.
    consequence_possible: whether another process's failure may be the real
      cause (the supervisor then waits a moment for that cause).
  """
  exit_code: int = ExitCode.FAILED
  consequence_possible = False

  def __init__(self, *args, exit_code: Optional[int] = None):
    super().__init__(*args)
    if exit_code is not None:
      self.exit_code = int(exit_code)


class ConfigError(PodrunError, ValueError):
  """A bad config, flag or workload name; a batch that does not fit."""
  exit_code = ExitCode.CONFIG_ERROR


def code_of(error: BaseException) -> int:
  """The exit code a process ends with after `error`.

  SystemExit keeps its code; KeyboardInterrupt is 128 + SIGINT; a
  PodrunError carries its own; anything else is FAILED.
  """
  if isinstance(error, SystemExit):
    if isinstance(error.code, int):
      return error.code
    return ExitCode.OK if error.code is None else ExitCode.FAILED
  if isinstance(error, KeyboardInterrupt):
    return SIGNAL_BASE + signal.SIGINT
  return getattr(error, 'exit_code', ExitCode.FAILED)


def may_be_consequence(error: BaseException) -> bool:
  """Whether another process's failure may have caused `error`: true for
  anything podrun did not diagnose itself (a gloo reset, say)."""
  if isinstance(error, PodrunError):
    return error.consequence_possible
  return not isinstance(error, KeyboardInterrupt)


def from_returncode(returncode: int) -> int:
  """Popen's returncode (negative for a signal) as a shell's exit status."""
  return SIGNAL_BASE - returncode if returncode < 0 else returncode


def signal_suffix(code: Optional[int]) -> str:
  """' (SIGKILL)' for exit code 137; '' for a code that is no signal's
  (or None, a process that has not exited)."""
  if code is not None and code > SIGNAL_BASE:
    try:
      return f' ({signal.Signals(code - SIGNAL_BASE).name})'
    except ValueError:
      pass
  return ''


# How long a job whose failed processes all say PEER_FAILED waits for the
# real cause before it names the first of them.
CAUSE_GRACE_S = 5.0


def root_cause(failed: Sequence[tuple[float, int]],
               now: float,
               all_exited: bool,
               grace_s: float = CAUSE_GRACE_S) -> Optional[int]:
  """Which failure ended the job, once it is known: the one rule of the
  local pod and the TPU driver.

  A process that stopped because another failed (PEER_FAILED) may exit
  before the cause does (process 0 waits until the others have read its
  cause), so such exits alone wait `grace_s` for the cause.

  Args:
    failed: (when it exited, its exit code) of each process that exited
      with a code other than 0, in any order; `when` on the clock of `now`.
    now: the time now.
    all_exited: every process has exited: nothing more is coming.

  Returns:
    The index into `failed` of the root cause, or None while unknown.

  Example:
    >>> root_cause([(3.0, 10), (3.5, 7)], now=4.0, all_exited=False)
    1
  """
  if not failed:
    return None
  order = sorted(range(len(failed)), key=lambda i: failed[i][0])
  causes = [i for i in order if failed[i][1] != PEER_FAILED]
  if causes:
    return causes[0]
  if all_exited or now - failed[order[0]][0] > grace_s:
    return order[0]
  return None
