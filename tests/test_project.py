"""launcher/common/project.py: which files of a user's project travel, and
the projects refused before anything is copied."""

import os
import subprocess

import pytest

from launcher.common import project
from runtime.common import exit_codes
from tests import ray_cluster  # pylint: disable=unused-import; before Ray

pytestmark = pytest.mark.unit


def _write(root, name: str, data: bytes = b'x') -> None:
  path = root / name
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(data)


def test_in_git_the_files_git_does_not_ignore_travel(tmp_path):
  subprocess.run(['git', 'init', '-q', str(tmp_path)], check=True)
  for name in ('.gitignore', 'my_config.py', 'pkg/__init__.py', 'pkg/model.py',
               'data/train.csv', 'data/huge.bin', 'run.log',
               'pkg/__pycache__/model.cpython-311.pyc'):
    _write(tmp_path, name)
  (tmp_path / '.gitignore').write_text('*.log\ndata/huge.bin\n__pycache__/\n')
  assert project.listed_files(str(tmp_path)) == [
      '.gitignore', 'data/train.csv', 'my_config.py', 'pkg/__init__.py',
      'pkg/model.py'
  ]


def test_a_subdirectory_of_a_git_tree_lists_its_own_files(tmp_path):
  subprocess.run(['git', 'init', '-q', str(tmp_path)], check=True)
  _write(tmp_path, 'outside.py')
  _write(tmp_path, 'sub/inside.py')
  assert project.listed_files(str(tmp_path / 'sub')) == ['inside.py']


def test_outside_git_every_file_but_bytecode_travels(tmp_path):
  for name in ('my_config.py', 'data/train.csv', 'run.log',
               'pkg/__pycache__/model.cpython-311.pyc'):
    _write(tmp_path, name)
  found = project.find(str(tmp_path))
  assert found.files == ('data/train.csv', 'my_config.py', 'run.log')
  assert (found.directory, found.size, found.is_podrun) == (str(tmp_path), 3,
                                                            False)


def test_the_current_directory_is_the_default(tmp_path, monkeypatch):
  _write(tmp_path, 'my_config.py')
  monkeypatch.chdir(tmp_path)
  assert project.find('').directory == str(tmp_path)
  assert project.find(None).files == ('my_config.py',)


def test_a_missing_directory_exits_2_naming_it(tmp_path):
  with pytest.raises(project.ProjectError) as e:
    project.find(str(tmp_path / 'nowhere'))
  assert e.value.exit_code == exit_codes.CONFIG_ERROR
  assert f'--project_dir={tmp_path / "nowhere"}: no such directory' in str(
      e.value)


@pytest.mark.parametrize('name', ['runtime/__init__.py', 'launcher.py'])
def test_a_package_of_podruns_name_is_refused(tmp_path, name):
  _write(tmp_path, 'my_config.py')
  _write(tmp_path, name)
  with pytest.raises(project.ProjectError) as e:
    project.find(str(tmp_path))
  assert e.value.exit_code == exit_codes.CONFIG_ERROR
  assert f'holds {name}, which on every host' in str(e.value)
  assert 'Nothing was copied' in str(e.value)


@pytest.mark.parametrize(
    'names',
    [
        ['configs/default.py'],  # Flax's examples: a namespace portion
        ['configs/__init__.py', 'configs/default.py'],  # a regular package
    ])
def test_a_projects_own_configs_travel(tmp_path, names):
  # podrun's configs/ is a namespace portion of example configs: the
  # project's own `configs` is the project's, whichever kind it is.
  for name in names:
    _write(tmp_path, name)
  assert project.find(str(tmp_path)).files == tuple(sorted(names))


def test_podruns_own_checkout_may_hold_its_packages(tmp_path):
  _write(tmp_path, 'runtime/__init__.py')
  found = project.find(str(tmp_path), podrun_root=str(tmp_path))
  assert found.is_podrun and found.files == ('runtime/__init__.py',)


def test_a_project_over_the_cap_names_its_biggest_files_and_the_flag(tmp_path):
  mib = 1 << 20
  _write(tmp_path, 'data/big.bin', b'x' * (2 * mib))
  _write(tmp_path, 'data/small.bin', b'x' * (mib // 2))
  _write(tmp_path, 'my_config.py')
  with pytest.raises(project.ProjectError) as e:
    project.find(str(tmp_path), max_mb=2)
  message = str(e.value)
  assert 'is 2.5 MiB in 3 file(s), over --project_max_mb=2' in message
  assert 'the biggest: data/big.bin (2.0 MiB), data/small.bin (0.5 MiB)' in (
      message)
  assert project.find(str(tmp_path), max_mb=3).size == 2.5 * mib + 1


def test_a_symlink_to_a_file_travels_as_the_file(tmp_path):
  _write(tmp_path / 'elsewhere', 'weights.bin', b'abc')
  (tmp_path / 'proj').mkdir()
  os.symlink(tmp_path / 'elsewhere' / 'weights.bin',
             tmp_path / 'proj' / 'weights.bin')
  assert project.find(str(tmp_path / 'proj')).size == 3


def test_what_is_left_out_is_every_path_that_does_not_travel(tmp_path):
  subprocess.run(['git', 'init', '-q', str(tmp_path)], check=True)
  for name in ('.gitignore', 'a.py', 'src/b.py', 'src/notes.log', 'data/x.bin',
               'data/deep/y.bin', 'odd [1].log'):
    _write(tmp_path, name)
  (tmp_path / '.gitignore').write_text('*.log\ndata/\n')
  found = project.find(str(tmp_path))
  assert found.files == ('.gitignore', 'a.py', 'src/b.py')
  assert project.left_out(found) == [
      '/.git/', '/data/', '/odd\\ \\[1\\].log', '/src/notes.log'
  ]


def test_ray_takes_the_left_out_patterns_as_they_are_meant():
  # Ray matches runtime_env excludes with its own copy of pathspec (Ray
  # imported after tests/ray_cluster.py, which keeps it on 127.0.0.1).
  pytest.importorskip('ray')
  from ray._private.thirdparty import pathspec  # pylint: disable=g-import-not-at-top
  spec = pathspec.PathSpec.from_lines(
      'gitwildmatch', ['/.git/', '/odd\\ \\[1\\].log', '/src/notes.log'])
  assert spec.match_file('odd [1].log')
  assert spec.match_file('.git/HEAD')
  assert spec.match_file('src/notes.log')
  assert not spec.match_file('src/b.py') and not spec.match_file('odd 1.log')
