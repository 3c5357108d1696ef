"""The jax.distributed coordination service, as the project uses it.

Every private JAX API the project touches sits here, so that a JAX upgrade
changes one file: the distributed client behind `jax.distributed` (its
key-value store and barriers with timeouts) and whether JAX's backend has
started. The coordination service runs inside process 0; when process 0 is
gone, every call here fails.

Example:
  >>> job = coordination.current()          # None without jax.distributed
  >>> job.set('podrun/x', 'hello')          # False when the key exists
  >>> job.barrier('podrun/saved', timeout_s=60)
"""

import dataclasses
import time
from typing import Optional, Sequence

from runtime.common import exit_codes

# The distributed client's methods `Job` calls: the same in JAX 0.10 to 0.12
# (tests/test_jax_versions.py checks the installed JAX has them).
CLIENT_METHODS = ('key_value_set', 'key_value_try_get',
                  'blocking_key_value_get', 'key_value_dir_get',
                  'key_value_delete', 'wait_at_barrier')

_default_timeout_s = 300.0


def set_default_timeout(seconds: float) -> None:
  """The timeout of barriers that name none (the launcher's --barrier_timeout)."""
  global _default_timeout_s
  _default_timeout_s = seconds


def default_timeout() -> float:
  """Seconds a cross-process wait may take (--barrier_timeout)."""
  return _default_timeout_s


class BarrierTimeout(exit_codes.PodrunError, TimeoutError):
  """Some processes did not reach a barrier in time.

  Attributes:
    name: the barrier.
    missing: the process ids that had not arrived.
    timeout_s: how long the others waited.
  """
  exit_code = exit_codes.STALLED

  def __init__(self, name: str, missing: Sequence[int], timeout_s: float,
               process_count: int):
    self.name, self.missing, self.timeout_s = name, list(missing), timeout_s
    ranks = ', '.join(f'rank {r}' for r in self.missing) or 'some ranks'
    super().__init__(
        f'{ranks} of {process_count} did not reach the barrier {name!r} '
        f'within {timeout_s:g} s (--barrier_timeout); the others stop here '
        'instead of waiting forever. Look at the log of the rank(s) named.')


def backend_started() -> bool:
  """Whether JAX has already initialised a backend (devices are fixed)."""
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  return xla_bridge.backends_are_initialized()


def _client():
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


def coordinator_address() -> str:
  """'HOST:PORT' of the coordinator this process joined, or ''."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.coordinator_address or ''


def _is(error: Exception, code: str) -> bool:
  return str(error).startswith(code)


@dataclasses.dataclass(frozen=True)
class Job:
  """This process's handle on the coordination service of its job.

  Attributes:
    process_id: this process.
    process_count: processes in the job.
  """
  process_id: int
  process_count: int

  def set(self, key: str, value: str, overwrite: bool = False) -> bool:
    """Stores value under key; returns False when the key exists already."""
    try:
      _client().key_value_set(key, value, allow_overwrite=overwrite)
    except Exception as e:  # pylint: disable=broad-except
      if _is(e, 'ALREADY_EXISTS'):
        return False
      raise
    return True

  def get(self, key: str) -> Optional[str]:
    """The value under key, or None when there is none."""
    try:
      return _client().key_value_try_get(key)
    except Exception as e:  # pylint: disable=broad-except
      if _is(e, 'NOT_FOUND'):
        return None
      raise

  def wait(self, key: str, timeout_s: float) -> Optional[str]:
    """The value under key once it is set; None after timeout_s."""
    try:
      return _client().blocking_key_value_get(key, max(1, int(timeout_s * 1e3)))
    except Exception as e:  # pylint: disable=broad-except
      if _is(e, 'DEADLINE_EXCEEDED'):
        return None
      raise

  def delete(self, key: str) -> None:
    """Removes key and every key under `key/`."""
    _client().key_value_delete(key)

  def directory(self, prefix: str) -> dict[str, str]:
    """{key: value} of every key under `prefix/`."""
    return dict(_client().key_value_dir_get(prefix.rstrip('/') + '/'))

  def barrier(self, name: str, timeout_s: Optional[float] = None) -> None:
    """Waits until every process calls barrier(name); at most timeout_s
    (default: the launcher's --barrier_timeout).

    Each process first leaves its mark under `name`, so that a timeout can
    say which processes never came.

    Raises:
      BarrierTimeout: naming the processes that did not arrive.
    """
    timeout_s = _default_timeout_s if timeout_s is None else timeout_s
    self.set(f'{name}/arrived/{self.process_id}', str(time.time()),
             overwrite=True)
    try:
      _client().wait_at_barrier(name, max(1, int(timeout_s * 1e3)))
    except Exception as e:  # pylint: disable=broad-except
      if not _is(e, 'DEADLINE_EXCEEDED'):
        raise
      arrived = {int(k.rsplit('/', 1)[1])
                 for k in self.directory(f'{name}/arrived')}
      missing = [r for r in range(self.process_count) if r not in arrived]
      raise BarrierTimeout(name, missing, timeout_s,
                           self.process_count) from None


def current() -> Optional[Job]:
  """The job's coordination service, or None in a process without one."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  state = distributed.global_state
  if state.client is None:
    return None
  return Job(state.process_id, state.num_processes)
