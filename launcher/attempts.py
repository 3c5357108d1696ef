"""One start of a whole job, and how it ended: what the job agent
(launcher/agent.py) drives and what the elastic policy (launcher/elastic.py)
reads, apart from both so that each can name them.

Example:
  >>> end = AttemptEnd(137, progressed=True, lost=(3,))
  >>> end.lost
  (3,)
"""

import dataclasses
from typing import Optional, Protocol

from runtime.common import records


@dataclasses.dataclass(frozen=True)
class AttemptEnd:
  """How one start of the job ended: all that `run` and an elastic policy
  read of it, as torchelastic's agent reads a worker group's RunResult.

  Attributes:
    code: the attempt's exit code (its root cause's, exit_codes).
    name: the name its processes' goodput ledgers are filed under (None:
      recorded so).
    processes: how many processes it ran (None: not known).
    launcher_signalled: whether whoever runs the launcher sent it SIGINT or
      SIGTERM meanwhile.
    progressed: whether any process completed a step (False: the failed
      attempt counts toward the back-off).
    counts_steps: whether `furthest_step` is known (False: a resize is
      taken to have trained something new).
    furthest_step: the furthest step any process completed, or None.
    fault: after a failure, when the failed process exited and when the
      attempt was declared failed, for the time to recover.
    infrastructure: when the attempt first had to bring its machines back
      (a TPU slice recreated after a preemption), which goodput counts as
      infrastructure recovery.
    regrew: it was stopped at a step boundary so that the job grows.
    lost: the process indices lost with their hosts (a local process's
      SIGKILL, a Ray node, a TPU slice), ascending, numbered as this
      attempt numbered them; what the elastic policy takes out
      (launcher/elastic.py).
  """
  code: int
  name: Optional[str] = None
  processes: Optional[int] = None
  launcher_signalled: bool = False
  progressed: bool = False
  counts_steps: bool = False
  furthest_step: Optional[int] = None
  fault: Optional[records.Fault] = None
  infrastructure: Optional[records.Recreate] = None
  regrew: bool = False
  lost: tuple[int, ...] = ()


class Attempt(Protocol):
  """One start of the whole job, as `run` drives it: a local pod
  (launcher/local/pod.py), a TPU pod's attempt (launcher/tpu/attempt.py)
  or a Ray job's (launcher/ray/attempt.py)."""

  def run(self) -> AttemptEnd:
    """Runs the attempt to its end; returns how it ended."""
