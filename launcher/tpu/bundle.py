"""The code a TPU launch copies to every worker: one reproducible tarball,
named by its SHA-256.

Two parts:
  podrun/   podrun's own code: the files git does not ignore in its
            checkout; or, installed without one (a wheel), its packages and
            a pyproject.toml written back from the installed metadata, which
            the worker's set-up installs;
  project/  the user's project (launcher/common/project.py); absent when
            the project is podrun's checkout itself, which runs from
            podrun/.
The same files give the same bytes (fixed owner, mode and time), so the hash
names podrun's code and the project together: every worker of a launch, and
a slice recreated later, runs the same.

Example:
  >>> bundle('/tmp/code.tar.gz', project.find('~/my_project'))
  '3f2a...'
"""

import gzip
import hashlib
import importlib.metadata
import io
import json
import os
import re
import tarfile
from typing import Optional, Union

from launcher.common import project as project_lib
from launcher.tpu.commands import PODRUN, PROJECT

# Where podrun's packages sit: its checkout, or site-packages.
_DISTRIBUTION = 'podrun'


def podrun_files(
    root: str = project_lib.PODRUN_SOURCE) -> dict[str, Union[str, bytes]]:
  """{path in podrun/: the file's path on this machine, or its bytes}.

  From a checkout: every file git does not ignore. Otherwise: the packages'
  files (no bytecode), and a pyproject.toml (the checkout's, or one
  written from the installed distribution's metadata).
  """
  if project_lib.is_checkout(root):
    return {n: os.path.join(root, n) for n in project_lib.listed_files(root)}
  files: dict[str, Union[str, bytes]] = {}
  for package in project_lib.PODRUN_PACKAGES:
    top = os.path.join(root, package)
    for name in project_lib.every_file(top):
      if not name.endswith(('.pyc', '.pyo')):
        files[f'{package}/{name}'] = os.path.join(top, name)
  if os.path.isfile(os.path.join(root, 'pyproject.toml')):
    for name in ('pyproject.toml', 'README.md'):
      if os.path.isfile(os.path.join(root, name)):
        files[name] = os.path.join(root, name)
  else:
    files['pyproject.toml'] = installed_pyproject().encode()
  return files


def installed_pyproject(distribution: str = _DISTRIBUTION) -> str:
  """A pyproject.toml for podrun's packages from the installed metadata:
  its name, version, Python range, dependencies and extras, so that a
  worker installs what this machine's podrun needs.

  Raises:
    importlib.metadata.PackageNotFoundError: podrun is not installed.
  """
  meta = importlib.metadata.metadata(distribution)
  dependencies: list[str] = []
  extras: dict[str, list[str]] = {
      e: [] for e in meta.get_all('Provides-Extra') or []
  }
  for requirement in importlib.metadata.requires(distribution) or []:
    spec, _, marker = requirement.partition(';')
    extra = re.fullmatch(r'\s*extra\s*==\s*["\']([^"\']+)["\']\s*', marker)
    if extra:
      extras.setdefault(extra.group(1), []).append(spec.strip())
    else:
      dependencies.append(requirement.strip())
  quote = json.dumps  # A JSON string of ASCII is a TOML basic string.
  lines = [
      '[build-system]', 'requires = ["setuptools>=68"]',
      'build-backend = "setuptools.build_meta"', '', '[project]',
      f'name = {quote(meta["Name"])}', f'version = {quote(meta["Version"])}'
  ]
  if 'Requires-Python' in meta:
    lines.append(f'requires-python = {quote(meta["Requires-Python"])}')
  lines += [
      f'dependencies = {quote(dependencies)}', '',
      '[project.optional-dependencies]'
  ]
  lines += [
      f'{name} = {quote(specs)}' for name, specs in sorted(extras.items())
  ]
  lines += [
      '', '[tool.setuptools.packages.find]',
      f'include = {quote([p + "*" for p in project_lib.PODRUN_PACKAGES])}'
  ]
  return '\n'.join(lines) + '\n'


def run_directory(project: Optional[project_lib.Project]) -> str:
  """The part of the bundle the job's processes run from."""
  return PROJECT if project and not project.is_podrun else PODRUN


def bundle(out: str,
           project: Optional[project_lib.Project] = None,
           root: str = project_lib.PODRUN_SOURCE) -> str:
  """Writes podrun's code and `project` to a reproducible .tar.gz at `out`;
  returns its sha256 (hex)."""
  entries = {f'{PODRUN}/{n}': v for n, v in podrun_files(root).items()}
  if project is not None and run_directory(project) == PROJECT:
    entries.update({
        f'{PROJECT}/{n}': os.path.join(project.directory, n)
        for n in project.files
    })
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode='w', format=tarfile.PAX_FORMAT) as tar:
    for name in sorted(entries):
      _add(tar, name, entries[name])
  data = gzip.compress(buffer.getvalue(), mtime=0)
  with open(out, 'wb') as f:
    f.write(data)
  return hashlib.sha256(data).hexdigest()


def _add(tar: tarfile.TarFile, name: str, source: Union[str, bytes]) -> None:
  """One file, with nothing of this machine's (owner, time) in it."""
  info = tarfile.TarInfo(name)
  info.mtime = 0
  if isinstance(source, bytes):
    info.size, info.mode = len(source), 0o644
    tar.addfile(info, io.BytesIO(source))
    return
  info.size = os.path.getsize(source)
  info.mode = 0o755 if os.access(source, os.X_OK) else 0o644
  with open(source, 'rb') as f:
    tar.addfile(info, f)
