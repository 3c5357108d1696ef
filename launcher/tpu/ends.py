"""When the job on a lost slice has ended: what the driver can know of it.

A preempted VM's shutdown cuts the ssh session that relays its job's log,
and gcloud re-runs the session until the VM is gone, so the job's
`podrun: exit 75` (saved, exited) never reaches the driver that way. The
driver learns the end otherwise, and goes on then rather than after
--lost_slice_wait:

- every process reported its end through ssh;
- the processes on the other slices all ended without a save (75): a save
  takes every process, so the lost slice's job cannot save either;
- the workdir is in a bucket: every lost process's goodput ledger there
  says `final` (each process writes it last, after its checkpoint and its
  record's last upload: `Ledgers`), and every other process reported;
- nothing the job keeps is in a bucket: the other slices' processes all
  saved (75), and whatever the lost VMs still write goes with their disks.

JAX-free, as the whole driver.

Example:
  >>> ledgers = Ledgers('gs://runs/mnist', 'job-1-2', processes=[0, 1])
  >>> ledgers.start()
  >>> over(exits, processes, lost={'0', '1'}, kept_in_bucket=True,
  ...      final=ledgers.final())
  'the lost processes 0, 1 wrote their last ledgers to gs://runs/mnist'
"""

import json
import threading
from typing import Callable, Iterable, Optional

from runtime.common import exit_codes
from runtime.common import layout
from launcher.common import record_mirror

# How often the bucket is read for the lost processes' ledgers.
POLL_S = 1.0


def over(exits: dict[str, int],
         processes: Iterable[str],
         lost: set[str],
         kept_in_bucket: bool,
         final: set[str],
         url: str = '') -> Optional[str]:
  """Why nothing of the job can still be saving, or None.

  Args:
    exits: {process id: exit code} of the processes that reported an end
      through ssh.
    processes: every process id of the attempt.
    lost: the ids of the processes on the lost slice(s).
    kept_in_bucket: whether the job keeps anything in a bucket (its
      workdir or its checkpoints).
    final: the lost processes whose final ledger is in the bucket.
    url: the bucket's workdir, for the reason.
  """
  processes = set(processes)
  if processes <= set(exits):
    return 'every process reported its job\'s end'
  others = sorted(processes - lost, key=int)
  if not all(p in exits for p in others):
    return None
  saved = [exits[p] == exit_codes.PREEMPTED for p in others]
  if others and not any(saved):
    return ('the job ended on the other slice(s) without a save, so the '
            'lost slice\'s cannot save')
  if url and lost and lost <= final:
    return (f'the lost processes {", ".join(sorted(lost, key=int))} wrote '
            f'their last ledgers to {url}')
  if others and all(saved) and not kept_in_bucket:
    return ('the other slice(s) saved, and what the lost VMs still write '
            'goes with their disks')
  return None


class Ledgers:
  """Reads, every POLL_S on a thread of its own, which of `ranks` have a
  final goodput ledger for `attempt` in the bucket's workdir `url`.

  A thread, so that a slow or unreachable bucket never holds up the wait
  it shortens (gcsfs retries for tens of seconds).
  """

  def __init__(self,
               url: str,
               attempt: str,
               processes: Iterable[int],
               fs_factory: Optional[Callable] = None):
    self.url = url.rstrip('/')
    record = layout.Record(self.url)
    self._paths = {str(i): record.ledger(attempt, i) for i in processes}
    self._fs_factory = fs_factory
    self._final: set[str] = set()
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def final(self) -> set[str]:
    """The ranks (as strings) whose last ledger is in the bucket."""
    return set(self._final)

  def start(self) -> 'Ledgers':
    self._thread = threading.Thread(target=self._poll,
                                    name='lost-ledgers',
                                    daemon=True)
    self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()

  def _poll(self) -> None:
    try:
      fs = (self._fs_factory or record_mirror.bucket_fs)()
    except Exception:  # pylint: disable=broad-except
      return  # No gcsfs: the wait runs to its ceiling, as before.
    while not self._stop.is_set() and set(self._paths) - self._final:
      try:
        found = fs.cat(
            [p for r, p in self._paths.items() if r not in self._final],
            on_error='omit')
      except Exception:  # pylint: disable=broad-except
        found = {}
      by_path = {p: r for r, p in self._paths.items()}
      for path, data in found.items():
        if _is_final(data):
          name = by_path.get(path) or by_path.get('gs://' + path)
          if name is not None:
            self._final.add(name)
      self._stop.wait(POLL_S)


def _is_final(data) -> bool:
  try:
    return bool(json.loads(data).get('final'))
  except (ValueError, AttributeError, TypeError):
    return False
