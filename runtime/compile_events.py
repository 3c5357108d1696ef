"""JAX's compilation, as its `jax.monitoring` events report it: one listener
per process, which every part that cares subscribes to.

The event names are the part most likely to move between JAX releases, so
they are read here alone (tests/test_jax_versions.py checks that the
installed JAX still sends them).

Example:
  >>> compile_events.on_seconds(lambda seconds: print('compiled', seconds))
  >>> before = compile_events.count_in_this_thread()
"""

import collections
import threading
from typing import Callable

import jax

# Seconds spent compiling: tracing, lowering, the backend (one event each).
COMPILE_EVENT_PREFIX = '/jax/core/compile/'
# Seconds spent reading a program back from the persistent cache.
CACHE_RETRIEVAL_EVENT = '/jax/compilation_cache/cache_retrieval_time_sec'
CACHE_HIT_EVENT = '/jax/compilation_cache/cache_hits'

_lock = threading.Lock()
_listening: list[bool] = []
_seconds_callbacks: list[Callable[[float], None]] = []
_cache_hit_callbacks: list[Callable[[], None]] = []
# thread id -> compile events seen, and their seconds.
_compiles: collections.Counter[int] = collections.Counter()
_seconds: dict[int, float] = collections.defaultdict(float)


def _on_duration(event: str, duration_secs: float, **kwargs) -> None:
  # JAX passes the duration by keyword in some versions: its name is JAX's.
  del kwargs
  duration = duration_secs
  if event.startswith(COMPILE_EVENT_PREFIX):
    _compiles[threading.get_ident()] += 1
  if event.startswith(COMPILE_EVENT_PREFIX) or event == CACHE_RETRIEVAL_EVENT:
    _seconds[threading.get_ident()] += duration
  if event.startswith(COMPILE_EVENT_PREFIX) or event == CACHE_RETRIEVAL_EVENT:
    for callback in list(_seconds_callbacks):
      callback(duration)


def _on_event(event: str, **kwargs) -> None:
  del kwargs
  if event == CACHE_HIT_EVENT:
    for callback in list(_cache_hit_callbacks):
      callback()


def listen() -> None:
  """Registers the process's listeners with JAX, once."""
  with _lock:
    if not _listening:
      jax.monitoring.register_event_duration_secs_listener(_on_duration)
      jax.monitoring.register_event_listener(_on_event)
      _listening.append(True)


def on_seconds(callback: Callable[[float], None]) -> None:
  """Calls callback(seconds) for every compilation (or cache read) event."""
  listen()
  _seconds_callbacks.append(callback)


def on_cache_hit(callback: Callable[[], None]) -> None:
  """Calls callback() for every program read from the persistent cache."""
  listen()
  _cache_hit_callbacks.append(callback)


def count_in_this_thread() -> int:
  """How many compile events this thread has seen since `listen`."""
  return _compiles[threading.get_ident()]


def seconds_in_this_thread() -> float:
  """The seconds of this thread's compile (and cache read) events since
  `listen`: a difference of two readings is what a span compiled."""
  listen()
  return _seconds.get(threading.get_ident(), 0.0)
