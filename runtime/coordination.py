"""The jax.distributed coordination service, as the project uses it.

Every private JAX API the project touches sits here, so that a JAX upgrade
changes one file: the distributed client behind `jax.distributed` (its
key-value store and barriers with timeouts) and whether JAX's backend has
started. The coordination service runs inside process 0; when process 0 is
gone, every call here fails.

Every cross-process round the project runs is one of three shapes, each a
method of `Client` with its wait bounded and `BarrierTimeout` naming who did
not come: `from_0` (process 0 makes a value, every process gets it),
`decide_on_0` (every process publishes, process 0 decides, every process
gets the verdict) and `exchange` (every process publishes and reads every
other's). Values published per process sit under `PREFIX/<process index>`,
read back with `by_process`.

Example:
  >>> client = coordination.current()       # None without jax.distributed
  >>> client.set('podrun/x', 'hello')       # False when the key exists
  >>> client.barrier('podrun/saved', timeout_s=60)
  >>> client.decide_on_0('podrun/agree', digest, lambda by_process: 'ok')
"""

import dataclasses
import time
from typing import Callable, Mapping, Optional, Sequence

from runtime.common import exit_codes

# The distributed client's methods `Client` calls: the same in JAX 0.10 to 0.12
# (tests/test_jax_versions.py checks the installed JAX has them).
CLIENT_METHODS = ('key_value_set', 'key_value_try_get',
                  'blocking_key_value_get', 'key_value_dir_get',
                  'key_value_delete', 'wait_at_barrier')

# Until the launcher sets --barrier_timeout's value (set_default_timeout).
DEFAULT_TIMEOUT_S = 300.0
_default_timeout_s = DEFAULT_TIMEOUT_S


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


def _timeout(timeout_s: Optional[float]) -> float:
  return _default_timeout_s if timeout_s is None else timeout_s


class Rounds:
  """The cross-process rounds, over any store with the methods of `Client`.

  A subclass provides `process_index`, `process_count`, `set`, `wait`,
  `directory` and `barrier`; tests give an in-memory one.
  """
  process_index: int
  process_count: int

  def set(self, key: str, value: str, overwrite: bool = False) -> bool:
    raise NotImplementedError

  def wait(self, key: str, timeout_s: float) -> Optional[str]:
    raise NotImplementedError

  def directory(self, prefix: str) -> dict[str, str]:
    raise NotImplementedError

  def barrier(self, name: str, timeout_s: Optional[float] = None) -> None:
    raise NotImplementedError

  def publish(self, prefix: str, value: str) -> None:
    """Stores this process's `value` under `prefix/<process index>`."""
    self.set(f'{prefix}/{self.process_index}', value, overwrite=True)

  def by_process(self, prefix: str) -> dict[int, str]:
    """{process index: value} of what the processes published so far.

    Only `prefix/<index>` itself counts, not the keys below it.
    """
    start = len(prefix.rstrip('/')) + 1
    return {
        int(k[start:]): v
        for k, v in self.directory(prefix).items()
        if k[start:].isdigit()
    }

  def wait_for(self,
               key: str,
               from_processes: Sequence[int],
               timeout_s: Optional[float] = None) -> str:
    """The value under `key` once set, at most timeout_s.

    Raises:
      BarrierTimeout: naming `from_processes`, which should have set it.
    """
    timeout_s = _timeout(timeout_s)
    value = self.wait(key, timeout_s)
    if value is None:
      raise BarrierTimeout(key, from_processes, timeout_s, self.process_count)
    return value

  def gather(self,
             prefix: str,
             timeout_s: Optional[float] = None) -> dict[int, str]:
    """Waits for every process's value under `prefix`.

    Returns:
      {process index: value} for all `process_count` processes.

    Raises:
      BarrierTimeout: naming every process that had not published after
        timeout_s, counted from the call.
    """
    timeout_s = _timeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    values, missing = {}, []
    for process_index in range(self.process_count):
      value = self.wait(f'{prefix}/{process_index}',
                        max(deadline - time.monotonic(), 1e-3))
      if value is None:
        missing.append(process_index)
      else:
        values[process_index] = value
    if missing:
      raise BarrierTimeout(f'{prefix}/<rank>', missing, timeout_s,
                           self.process_count)
    return values

  def from_0(self,
             key: str,
             make: Callable[[], str],
             timeout_s: Optional[float] = None) -> str:
    """Process 0 calls `make` and stores its value under `key`; every process
    returns that value.

    Raises:
      BarrierTimeout: on the others, when process 0 did not store it within
        timeout_s.
    """
    if self.process_index == 0:
      value = make()
      self.set(key, value, overwrite=True)
      return value
    return self.wait_for(key, [0], timeout_s)

  def decide_on_0(self,
                  prefix: str,
                  value: str,
                  decide: Callable[[Mapping[int, str]], str],
                  timeout_s: Optional[float] = None) -> str:
    """Publishes `value`; process 0 decides on everyone's; returns the verdict.

    Args:
      prefix: names the round; values go under `prefix/<process index>`, the
        verdict under `prefix/verdict`.
      value: this process's.
      decide: called on process 0 alone with {process index: value} of every
        process; returns the verdict every process gets.
      timeout_s: for each wait; --barrier_timeout if None.

    Raises:
      BarrierTimeout: on process 0 naming who did not publish; on the others
        when no verdict came.
    """
    self.publish(prefix, value)
    return self.from_0(f'{prefix}/verdict',
                       lambda: decide(self.gather(prefix, timeout_s)),
                       timeout_s)

  def exchange(self,
               prefix: str,
               value: str,
               timeout_s: Optional[float] = None) -> dict[int, str]:
    """Publishes `value` and returns every process's: {process index: value}.

    Raises:
      BarrierTimeout: naming the processes that did not publish in time.
    """
    self.publish(prefix, value)
    self.barrier(f'{prefix}/published', timeout_s)
    return self.by_process(prefix)


@dataclasses.dataclass(frozen=True)
class Client(Rounds):
  """This process's client of the coordination service of its job.

  Attributes:
    process_index: this process.
    process_count: processes in the job.
  """
  process_index: int
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
    timeout_s = _timeout(timeout_s)
    self.publish(f'{name}/arrived', str(time.time()))
    try:
      _client().wait_at_barrier(name, max(1, int(timeout_s * 1e3)))
    except Exception as e:  # pylint: disable=broad-except
      if not _is(e, 'DEADLINE_EXCEEDED'):
        raise
      arrived = self.by_process(f'{name}/arrived')
      missing = [r for r in range(self.process_count) if r not in arrived]
      raise BarrierTimeout(name, missing, timeout_s,
                           self.process_count) from None


def current() -> Optional[Client]:
  """The job's coordination service, or None in a process without one."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  state = distributed.global_state
  if state.client is None:
    return None
  return Client(state.process_id, state.num_processes)
