"""One search for Google credentials per process, shared by its gs:// clients.

gcsfs makes a file system per thread and per set of arguments (fsspec's
instance cache keys on both: the record's mirror, the lease, epath under
orbax and each of orbax's threads get their own), and each one looks for
credentials anew: GOOGLE_APPLICATION_CREDENTIALS, gcloud's file, then the
metadata server. Where no metadata server answers and nothing else holds
credentials (an emulator off Google Cloud), every search waits out its
timeouts: 9.3 s for the record's fetch and 18.2 s for a restore with
nothing to restore, measured here with a metadata address that accepts and
never replies. So the search runs once per process, in the background from
the process's start (`start`), and `wait` hands its answer to every gcsfs
file system made after it through fsspec's config (`token`), unless the
user's own fsspec config names one.

An emulator (STORAGE_EMULATOR_HOST) takes no credentials: 'anon' at once,
as gcsfs's documentation has it for emulators.

JAX-free: the launcher's side (the record's mirror, the TPU driver's wait
for the lost ledgers) and each process of a job (the lease, the
checkpoints, a dataset in a bucket) use it.

Example:
  >>> gcs_auth.start()        # at the process's start; returns at once
  >>> fs = gcs_auth.filesystem()   # waits for the search, once
"""

import os
import threading
import time
from typing import Any, Optional

from absl import logging

# gcsfs asks google.auth for this scope; credentials found for less could
# not write the record.
_SCOPES = ('https://www.googleapis.com/auth/devstorage.full_control',)
# A search slower than this is said, with what to set.
SLOW_S = 1.0
_PROTOCOLS = ('gs', 'gcs')

_lock = threading.Lock()
_search: Optional[threading.Thread] = None
_found: dict[str, Any] = {}


def emulator() -> str:
  """The emulator's address, or '' for Cloud Storage itself."""
  host = os.environ.get('STORAGE_EMULATOR_HOST', '')
  return '' if host in ('', 'default') else host


def find_token() -> tuple[dict[str, Any], str]:
  """(gcsfs's arguments, where they came from): {'token': credentials or
  'anon', 'project': ...}; {} where gcsfs should search itself (its own
  token cache holds some). With no credentials anywhere, 'anon': where
  gcsfs's own search ends too, after waiting again."""
  if emulator():
    return {'token': 'anon'}, f'the emulator at {emulator()} takes none'
  import google.auth  # pylint: disable=g-import-not-at-top
  import google.auth.exceptions  # pylint: disable=g-import-not-at-top
  try:
    credentials, project = google.auth.default(scopes=list(_SCOPES))
  except google.auth.exceptions.DefaultCredentialsError as e:
    if os.path.exists(_gcsfs_token_cache()):
      return {}, f'{_gcsfs_token_cache()}, by gcsfs'
    return {'token': 'anon'}, f'none found, anonymous: {str(e).split(".")[0]}'
  found: dict[str, Any] = {'token': credentials}
  if project:
    found['project'] = project
  return found, f'google.auth.default, project {project}'


def _gcsfs_token_cache() -> str:
  """Where gcsfs keeps the tokens of its browser login."""
  return os.path.join(os.path.expanduser('~'), '.gcs_tokens')


def _run_search() -> None:
  began = time.monotonic()
  try:
    arguments, source = find_token()
  except Exception as e:  # pylint: disable=broad-except
    # gcsfs will search itself and say what is wrong.
    arguments, source = {}, f'the search failed: {e!r}'
  _found.update(arguments=arguments,
                source=source,
                seconds=time.monotonic() - began)


def start() -> None:
  """Begins the search in the background, once per process."""
  global _search
  with _lock:
    if _search is None:
      _search = threading.Thread(target=_run_search,
                                 name='gcs-credentials',
                                 daemon=True)
      _search.start()


def wait() -> float:
  """Waits for the search and makes its answer every later gcsfs file
  system's `token`. Returns the seconds the search took, the first time;
  0.0 after."""
  import fsspec.config  # pylint: disable=g-import-not-at-top
  start()
  assert _search is not None  # start() made it.
  _search.join()
  with _lock:
    if _found.get('installed'):
      return 0.0
    _found['installed'] = True
    # A user's own fsspec config (a token, a project) wins.
    for protocol in _PROTOCOLS:
      settings = fsspec.config.conf.setdefault(protocol, {})
      if 'token' not in settings:
        for name, value in _found['arguments'].items():
          settings.setdefault(name, value)
  seconds = _found['seconds']
  if seconds > SLOW_S:
    logging.warning(
        'finding Google credentials took %.1f s (%s), which the metadata '
        'server\'s timeouts make where none answers: set '
        'GOOGLE_APPLICATION_CREDENTIALS to a key file or run `gcloud auth '
        'application-default login` off Google Cloud', seconds,
        _found['source'])
  return seconds


def filesystem():
  """gcsfs's file system for gs:// URLs, after the search; a missing gcsfs
  is named."""
  try:
    import gcsfs  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise RuntimeError(
        'a gs:// workdir needs gcsfs: pip install -e ".[gcs]" (the tpu extra '
        'has it)') from e
  wait()
  return gcsfs.GCSFileSystem()
