"""The flags every process of the job reads, declared once (flag_spec):
how it joins (`CoordinatorFlags`) and how it is watched (`WatchFlags`).
launcher/cli_flags.py defines the absl flags from these fields; the
process's side (launcher/process/distributed.py, supervisor.py) takes the
values back as these classes.

Example:
  >>> WatchFlags().heartbeat_timeout
  15.0
"""

import dataclasses
from typing import Optional

from launcher.common import cluster
from launcher.common import flag_spec
from launcher.common import job_tls
from runtime.common import handoff

_S = flag_spec.SUPERVISION


@dataclasses.dataclass(frozen=True)
class WatchFlags:
  """The supervision flags (launcher/process/supervisor.py reads them).

  Attributes:
    heartbeat_timeout: seconds of silence after which a process is lost.
    stall_timeout: seconds without a completed step, after the first; 0
      disables. The ceiling of the learned deadline (stall.py).
    first_step_timeout: seconds to complete the first step; 0 disables.
    barrier_timeout: seconds any cross-process wait may take.
    enabled: False leaves the job unwatched (--nosupervision).
    learned_stall_deadline: learn the deadline from the run's pace;
      False: stall_timeout is the deadline.
    stall_floor: the shortest learned deadline.
    lease_timeout: seconds after which another job's unrenewed lease on the
      workdir is taken over (launcher/process/lease.py).
  """
  heartbeat_timeout: float = flag_spec.flag(
      15, _S, 'seconds of silence before a process is lost',
      'Seconds without a heartbeat after which a process of the job is taken '
      'for lost: every other process names it and exits 10.')
  stall_timeout: float = flag_spec.flag(
      600, _S, 'ceiling, in seconds, between two steps',
      'Every rank: end the job (stacks dumped, exit 124) when no step '
      'completes for this many seconds after the first step; 0 disables. The '
      'ceiling of the learned deadline (--learned_stall_deadline).')
  learned_stall_deadline: bool = flag_spec.flag(
      True, _S, "a deadline learned from the run's pace",
      'Every rank: end the job as stalled sooner than --stall_timeout when no '
      'step completes within a deadline bounded by the run\'s own pace: in '
      'the first 20 steps max(--stall_floor, 3 x the longest of the first '
      'step, a step or a compilation seen), then max(--stall_floor, 10 x the '
      'p99 interval between steps, 3 x the longest interval or compilation '
      'seen), allowing 3 x the longest save or evaluation seen while one '
      'runs (launcher/process/stall.py). Kept in WORKDIR/stall for the next '
      'attempt. False: --stall_timeout is the deadline.')
  stall_floor: float = flag_spec.flag(
      10, _S, 'the shortest deadline it may learn, in seconds',
      'Every rank: the shortest deadline --learned_stall_deadline may learn, '
      'in seconds; with several processes at least --heartbeat_timeout + 2.')
  first_step_timeout: float = flag_spec.flag(
      1800, _S, 'seconds for start-up and the first step',
      'Every rank: end the job (stacks dumped, exit 124) when the first step '
      '(start-up and compilation) does not complete within this many '
      'seconds; 0 disables.')
  barrier_timeout: float = flag_spec.flag(
      300, _S, 'seconds any cross-process wait may take',
      'Seconds any cross-process wait (checkpoint directory check, '
      'preemption save, end of run, shutdown) may take before it names the '
      'missing ranks and exits 124.')
  enabled: bool = flag_spec.flag(
      True,
      _S,
      'failure broadcast, watchdog, stragglers, lease',
      'Every rank watches the job through the coordination service: failure '
      'broadcast, lost processes, the hang watchdog, stragglers, the workdir '
      'lease. --nosupervision turns it off (for measuring its cost).',
      name='supervision')
  lease_timeout: float = flag_spec.flag(
      60, _S, "seconds before a silent job's workdir lease lapses",
      'Seconds after which another job\'s lease on the workdir, not renewed '
      'since, is taken for the lease of a dead job and taken over.')


@dataclasses.dataclass(frozen=True)
class CoordinatorFlags:
  """The distributed flags (launcher/process/distributed.py reads them).

  Attributes:
    coordinator_address: 'HOST:PORT' of process 0's coordinator service.
    num_processes: processes in the job.
    process_id: this process, in [0, num_processes).
    coordinator_bind_address: 'HOST:PORT' the coordinator listens on, also
      on a cluster JAX detects (where JAX_COORDINATOR_PORT fixes the port);
      None: the address --coordinator_address names, where it is one of
      this machine's (`bind_address`), else every interface.
    initialization_timeout: seconds to wait for every process to join.
    heartbeat_timeout: seconds of silence after which the project's own
      supervision (supervisor.py) declares a process lost; JAX's heartbeat,
      which aborts every process without saying much, is set
      JAX_HEARTBEAT_MARGIN_S later as a backstop.
    barrier_timeout: seconds JAX's shutdown barrier waits at exit for the
      other processes (--barrier_timeout, which bounds every wait).
    tls: --tls, 'auto', 'require' or 'off' (credentials.py).
    tls_dir: --tls_dir, the job's certificate authority.
    cluster: --cluster, cluster.AUTO or cluster.NONE.
  """
  coordinator_address: Optional[str] = flag_spec.flag(
      None,
      flag_spec.LOCAL_POD,
      'HOST:PORT of process 0 (a local pod: the port)',
      'HOST:PORT of process 0\'s coordinator. With --local_processes: the '
      'loopback port to use instead of a free one.',
      pod_sets=True)
  num_processes: Optional[int] = flag_spec.flag(
      None,
      flag_spec.CLUSTER,
      'processes in the job (else detected)',
      'Processes in the job.',
      pod_sets=True)
  process_id: Optional[int] = flag_spec.flag(
      None,
      flag_spec.CLUSTER,
      'this process, in [0, num_processes)',
      'This process, in [0, num_processes).',
      pod_sets=True)
  cluster: str = flag_spec.flag(
      cluster.AUTO,
      flag_spec.CLUSTER,
      'auto: join the cluster found, else run alone; none: alone',
      'auto: join the cluster the environment names (SLURM, Open MPI, '
      'Kubernetes, a TPU slice whose metadata server names several workers), '
      'else run one process on all of this host\'s devices; none: run one '
      'process alone, whatever the environment says.',
      choices=cluster.CHOICES,
      pod_sets=True)
  coordinator_bind_address: Optional[str] = flag_spec.flag(
      None,
      flag_spec.CLUSTER,
      'HOST:PORT process 0 listens on',
      'HOST:PORT the coordinator listens on; default every interface.',
      pod_sets=True)
  tls: str = flag_spec.flag(
      job_tls.AUTO,
      flag_spec.TRUST,
      'auto, require or off: mutual TLS on the coordinator',
      'Mutual TLS on the coordinator (JAX 0.12 and newer): auto uses it '
      'where JAX has it (a local pod makes its own authority; a cluster\'s '
      'job needs --tls_dir) and says so where not; require refuses to start '
      'without it; off joins without it (docs/trust.md).',
      choices=job_tls.MODES,
      pod_sets=True)
  tls_dir: Optional[str] = flag_spec.flag(
      None,
      flag_spec.TRUST,
      "the job's certificate authority (podrun-tls DIR)",
      'The job\'s certificate authority (`podrun-tls DIR` makes one), on a '
      f'path every host reads; default ${handoff.variable("tls_dir")}.',
      pod_sets=True)
  initialization_timeout: int = flag_spec.flag(
      300, flag_spec.CLUSTER, 'seconds for every process to join',
      'Seconds to wait for every process to join the job.')
  heartbeat_timeout: float = flag_spec.same_as(WatchFlags, 'heartbeat_timeout')
  barrier_timeout: float = flag_spec.same_as(WatchFlags, 'barrier_timeout')
