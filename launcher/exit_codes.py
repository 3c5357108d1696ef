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
# A checkpoint that does not fit the run (config or shapes differ), or a
# checkpoint directory that the processes of the job do not all share.
CHECKPOINT_ERROR = 5
# scripts/launch_tpu_pod.sh: the Cloud TPU pod is not READY and HEALTHY in
# time, or is preempted or terminated and must be recreated.
POD_UNAVAILABLE = 6
# Stopped because another process of the job failed, was lost or could
# not be reached; the log names that process and its own exit code.
PEER_FAILED = 10
# Another job holds the lease on this workdir or checkpoint directory; the
# message names it (host, pid, job id, since when).
WORKDIR_BUSY = 11
# Preempted: every process saved a checkpoint of the same step and stopped.
# Run the same command again to resume (as EX_TEMPFAIL: try again later).
PREEMPTED = 75
# The hang watchdog fired: no rank completed a step for --stall_timeout
# seconds (or its first step within --first_step_timeout), or a
# cross-process wait ran past --barrier_timeout. As timeout(1).
STALLED = 124
# The launcher itself got SIGINT (or SIGTERM that did not end in a clean
# preemption): 128 + the signal, as a shell.
SIGNAL_BASE = 128


def from_returncode(returncode: int) -> int:
  """Popen's returncode (negative for a signal) as a shell's exit status."""
  return SIGNAL_BASE - returncode if returncode < 0 else returncode


# A user's own mistake: the same run fails the same way again.
NEVER_RETRIED = (OK, FAILED, CONFIG_ERROR, TOPOLOGY_MISMATCH, CHECKPOINT_ERROR,
                 WORKDIR_BUSY)

# Faults every process of a job finds by itself (the same config, the same
# pod, the same checkpoint): each keeps its own code rather than PEER_FAILED.
SAME_EVERYWHERE = (CONFIG_ERROR, TOPOLOGY_MISMATCH, DISTRIBUTED_INIT_FAILED,
                   CHECKPOINT_ERROR, WORKDIR_BUSY, STALLED)
