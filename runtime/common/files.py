"""Writing a file whole: readers see the old contents or the new, never half.

JAX-free (runtime/common): the supervisor writes summaries with it too.

Example:
  >>> write_atomic('/runs/a/summary.json', json.dumps(summary))
  >>> write_json('/runs/a/summary.json', {'loss': np.float32(0.5)})
"""

import json
import math
import os
import threading
from typing import Any


def write_atomic(path: str, text: str) -> None:
  """Writes `text` to a temporary file beside `path`, then renames it.

  Args:
    path: a local path; its directory is created if missing.
    text: the whole new contents.
  """
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  # One name per thread: two threads of a process writing the same file (a
  # lease's renewal and its taker) would otherwise rename each other's.
  tmp = f'{path}.tmp{os.getpid()}_{threading.get_ident()}'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)


def to_json(value: Any) -> Any:
  """Turns numpy and JAX scalars and arrays into plain JSON values.

  Anything with `shape`, `dtype` and `tolist` counts as an array, so this
  needs neither numpy nor JAX to be imported.
  """
  if isinstance(value, dict):
    return {str(k): to_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_json(v) for v in value]
  if hasattr(value, 'shape') and hasattr(value, 'dtype'):
    import numpy as np  # pylint: disable=g-import-not-at-top
    value = np.asarray(value)
    return value.item() if value.ndim == 0 else value.tolist()
  if isinstance(value, float) and not math.isfinite(value):
    return repr(value)
  return value


def write_json(path: str, value: Any) -> None:
  """Writes JSON through a temporary file, so readers never see half of it."""
  write_atomic(path,
               json.dumps(to_json(value), indent=2, sort_keys=True) + '\n')
