"""Writing a file whole: readers see the old contents or the new, never half.

Example:
  >>> write_atomic('/runs/a/summary.json', json.dumps(summary))
"""

import os


def write_atomic(path: str, text: str) -> None:
  """Writes `text` to a temporary file beside `path`, then renames it.

  Args:
    path: a local path; its directory is created if missing.
    text: the whole new contents.
  """
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)
