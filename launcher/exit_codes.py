"""The launcher's exit codes, one meaning each (the README lists them too).

A rank's own exit code passes through unchanged: the launcher exits with the
code of the rank that failed first, and 128 + N when that rank was killed by
signal N, as a shell reports it.
"""

OK = 0
# An uncaught exception in a workload: Python's own code for it.
FAILED = 1
# A bad config, flag or workload name, or a batch that does not fit the pod.
CONFIG_ERROR = 2
# The pod that joined is not the pod the config or the flags describe.
TOPOLOGY_MISMATCH = 3
# jax.distributed could not start: port in use, coordinator unreachable,
# JAX touched before initialisation.
DISTRIBUTED_INIT_FAILED = 4
# The hang watchdog fired: no rank completed a step for --stall_timeout
# seconds (or its first step within --first_step_timeout). As timeout(1).
STALLED = 124
# The launcher itself got SIGINT or SIGTERM: 128 + the signal, as a shell.
SIGNAL_BASE = 128


def from_returncode(returncode: int) -> int:
  """Popen's returncode (negative for a signal) as a shell's exit status."""
  return SIGNAL_BASE - returncode if returncode < 0 else returncode
