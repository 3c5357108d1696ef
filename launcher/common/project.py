"""The user's project: the directory a launch runs from, as the files that
travel to hosts which do not share this machine's disk.

Its files are those git does not ignore when the directory is in a git work
tree, every file otherwise (but Python's bytecode caches). Each process of
the job then runs from the project's copy on its host, so that `--config`
paths, the module `config.workload` names and relative data paths mean there
what they mean here. Checked before anything is copied: a project that
holds a package podrun's own would be shadowed by, or one over the size
cap, is refused (exit 2), naming what to change.

Example:
  >>> found = find('~/my_project', max_mb=100)
  >>> found.files[:2], found.size
  (('data/train.csv', 'my_config.py'), 48213)
"""

import dataclasses
import os
import subprocess
from typing import Optional

from runtime.common import exit_codes

# Where podrun's own packages sit: its checkout, or site-packages.
PODRUN_SOURCE = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A launch's default cap on the project's size, in MiB (--project_max_mb).
DEFAULT_MAX_MB = 100.0
# podrun's own top-level packages, as they travel with a job.
PODRUN_PACKAGES = ('launcher', 'runtime', 'configs')
# Those a regular package or module of the same name in the project would be
# imported in place of on every host (the project's directory comes first on
# sys.path). podrun's `configs` is a namespace portion holding only its
# example configs, which run by path: a project's own `configs` wins.
SHADOWED = ('launcher', 'runtime')
_MIB = 1 << 20


class ProjectError(exit_codes.ConfigError):
  """The project cannot travel as it is (exit 2); nothing was copied."""


@dataclasses.dataclass(frozen=True)
class Project:
  """The files of a project, as they will travel.

  Attributes:
    directory: its absolute path on this machine.
    files: the paths of its files relative to `directory`, sorted.
    size: their total size in bytes.
    is_podrun: the project is podrun's own checkout (a job of its built-in
      workloads, launched from it), which travels as podrun's code.
  """
  directory: str
  files: tuple[str, ...]
  size: int
  is_podrun: bool = False


def listed_files(directory: str) -> list[str]:
  """The files of `directory` that travel, relative to it, sorted: those git
  does not ignore (tracked and untracked) inside a git work tree, every file
  but __pycache__ elsewhere."""
  names = git_files(directory)
  return every_file(directory) if names is None else sorted(
      n for n in set(names) if os.path.isfile(os.path.join(directory, n)))


def every_file(directory: str) -> list[str]:
  """Every file under `directory` but __pycache__, relative to it, sorted,
  whatever git says (an installed package in a virtual environment that a
  repository ignores is still whole)."""
  names = []
  for root, dirs, files in os.walk(directory):
    dirs[:] = sorted(d for d in dirs if d != '__pycache__')
    rel = os.path.relpath(root, directory)
    names += [n if rel == '.' else os.path.join(rel, n) for n in files]
  return sorted(n for n in names if os.path.isfile(os.path.join(directory, n)))


def _in_work_tree(directory: str) -> bool:
  try:
    inside = subprocess.run(
        ['git', '-C', directory, 'rev-parse', '--is-inside-work-tree'],
        capture_output=True,
        text=True,
        check=False)
  except OSError:  # No git.
    return False
  return inside.returncode == 0 and inside.stdout.strip() == 'true'


def git_files(directory: str) -> Optional[list[str]]:
  """What `git ls-files` lists under `directory` (relative to it), or None
  when it is not in a git work tree or git is missing."""
  if not _in_work_tree(directory):
    return None
  try:
    out = subprocess.run([
        'git', '-C', directory, 'ls-files', '-z', '--cached', '--others',
        '--exclude-standard'
    ],
                         check=True,
                         capture_output=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return None
  return [n for n in out.decode().split('\0') if n]


def is_checkout(root: str = PODRUN_SOURCE) -> bool:
  """Whether `root` (podrun's source) is a git checkout, not site-packages."""
  return (os.path.isfile(os.path.join(root, 'pyproject.toml')) and
          _in_work_tree(root))


def podrun_root() -> str:
  """podrun's checkout, or '' when it is installed from a wheel."""
  return PODRUN_SOURCE if is_checkout() else ''


def left_out(found: Project) -> list[str]:
  """What under the project's directory does not travel, as anchored
  .gitignore patterns (for Ray's runtime_env `excludes`): whole directories
  where nothing in them travels, else single files.

  Example:
    >>> left_out(Project('/p', ('a.py', 'src/b.py'), 10))
    ['/.git/', '/data/', '/src/notes.log']
  """
  keep = set(found.files)
  keep_dirs = {os.path.dirname(n) for n in keep}
  for name in list(keep_dirs):
    while name:
      name = os.path.dirname(name)
      keep_dirs.add(name)
  out = []
  for root, dirs, files in os.walk(found.directory):
    rel = os.path.relpath(root, found.directory)
    rel = '' if rel == '.' else rel
    for d in sorted(dirs):
      if os.path.join(rel, d) not in keep_dirs:
        out.append('/' + _escaped(os.path.join(rel, d)) + '/')
    dirs[:] = sorted(d for d in dirs if os.path.join(rel, d) in keep_dirs)
    out += [
        '/' + _escaped(os.path.join(rel, f))
        for f in sorted(files)
        if os.path.join(rel, f) not in keep
    ]
  return out


def _escaped(path: str) -> str:
  """`path` with .gitignore's special characters taken literally."""
  return ''.join('\\' + c if c in '\\[]*?!# ' else c for c in path)


def shadowing(files) -> list[str]:
  """The files of a project that would shadow podrun's own packages: a
  regular package (NAME/__init__.py) or a module (NAME.py) at its top. A
  directory NAME/ without __init__.py does not: Python prefers the regular
  package to a namespace portion."""
  found = []
  for name in SHADOWED:
    for path in (f'{name}/__init__.py', f'{name}.py'):
      if path in files:
        found.append(path)
  return found


def find(directory: Optional[str],
         max_mb: float = DEFAULT_MAX_MB,
         flag: str = '--project_dir',
         podrun_root: str = '') -> Project:
  """The project at `directory` (default: the current one), checked.

  Args:
    directory: the project's directory, as the user gave it; '' or None for
      the current directory.
    max_mb: the cap on its size in MiB.
    flag: how the user names the directory, for the errors.
    podrun_root: podrun's own checkout, if it runs from one: that project
      holds podrun's packages by right.

  Raises:
    ProjectError: the directory does not exist; it holds a package of
      podrun's name; its files are over `max_mb` (naming the biggest and
      --project_max_mb).
  """
  path = os.path.abspath(os.path.expanduser(directory or os.curdir))
  if not os.path.isdir(path):
    raise ProjectError(f'{flag}={directory}: no such directory ({path})')
  files = tuple(listed_files(path))
  is_podrun = bool(podrun_root) and (os.path.realpath(path)
                                     == os.path.realpath(podrun_root))
  clashes = [] if is_podrun else shadowing(files)
  if clashes:
    raise ProjectError(
        f'the project {path} holds {", ".join(clashes)}, which on every host '
        f'would be imported instead of podrun\'s own package of that name '
        f'({" and ".join(SHADOWED)} are podrun\'s): rename it, or launch '
        f'from (or with {flag}=) a directory without it. Nothing was copied.')
  sizes = {n: os.path.getsize(os.path.join(path, n)) for n in files}
  size = sum(sizes.values())
  if size > max_mb * _MIB:
    biggest = sorted(sizes, key=lambda n: (-sizes[n], n))[:5]
    raise ProjectError(
        f'the project {path} is {size / _MIB:.1f} MiB in {len(files)} '
        f'file(s), over --project_max_mb={max_mb:g}; the biggest: ' +
        ', '.join(f'{n} ({sizes[n] / _MIB:.1f} MiB)' for n in biggest) +
        '. Leave data out (a .gitignore entry in a git repository; a '
        'gs:// path for the data), launch from a smaller directory with '
        f'{flag}=DIR, or raise --project_max_mb. Nothing was copied.')
  return Project(path, files, size, is_podrun)
