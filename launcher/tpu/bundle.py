"""The project's code as one reproducible tarball, named by its SHA-256.

The same files give the same bytes (fixed owner, mode and time), so the hash
names the code and every worker of a launch runs the same.

Example:
  >>> bundle('/tmp/code.tar.gz')
  '3f2a...'
"""

import gzip
import hashlib
import io
import os
import subprocess
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def project_files(repo: str = REPO) -> list[str]:
  """The files git does not ignore (tracked and untracked), sorted."""
  try:
    out = subprocess.run(
        ['git', '-C', repo, 'ls-files', '-z', '--cached', '--others',
         '--exclude-standard'], check=True, capture_output=True).stdout
  except (OSError, subprocess.CalledProcessError) as e:
    raise RuntimeError(f'cannot list the project files of {repo} with git '
                       f'(needed to honour .gitignore): {e}') from e
  names = sorted({n for n in out.decode().split('\0') if n})
  return [n for n in names if os.path.isfile(os.path.join(repo, n))]


def bundle(out: str, repo: str = REPO) -> str:
  """Writes the project's files to a reproducible .tar.gz; returns its sha256.

  The same files give the same bytes (fixed owner, mode and time), so the
  hash names the code: every worker of a launch runs the same.
  """
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode='w', format=tarfile.PAX_FORMAT) as tar:
    for name in project_files(repo):
      path = os.path.join(repo, name)
      info = tarfile.TarInfo(name)
      info.size = os.path.getsize(path)
      info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
      info.mtime = 0
      with open(path, 'rb') as f:
        tar.addfile(info, f)
  data = gzip.compress(buffer.getvalue(), mtime=0)
  with open(out, 'wb') as f:
    f.write(data)
  return hashlib.sha256(data).hexdigest()
