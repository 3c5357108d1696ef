"""podrun's version, as the installed package says it (pyproject.toml's
`version` for a checkout installed with `pip install -e`), read without
importing JAX."""

import importlib.metadata
import pathlib
import re

_PYPROJECT = pathlib.Path(__file__).resolve().parents[2] / 'pyproject.toml'


def podrun() -> str:
  """'0.2.0', from the installed metadata, else the checkout's
  pyproject.toml (a tree on PYTHONPATH, not installed); 'unknown' else."""
  try:
    return importlib.metadata.version('podrun')
  except importlib.metadata.PackageNotFoundError:
    pass
  try:
    found = re.search(r'^version = "([^"]+)"', _PYPROJECT.read_text(), re.M)
  except OSError:
    found = None
  return found.group(1) if found else 'unknown'


def line(command: str = 'podrun') -> str:
  """What --version prints: 'podrun 0.2.0 (JAX 0.10.2, Python 3.11.7)'."""
  import platform  # pylint: disable=g-import-not-at-top
  try:
    jax = importlib.metadata.version('jax')
  except importlib.metadata.PackageNotFoundError:
    jax = 'not installed'
  return (f'{command} {podrun()} (JAX {jax}, Python '
          f'{platform.python_version()})')
