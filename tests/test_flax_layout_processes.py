"""A project laid out as Flax's examples are: configs/default.py, a sibling
config that imports it (`from configs import default`), and the training
module beside them, run with the `podrun` command of a wheel (not an
editable install) from the project's own directory, on 1x8 and 2x4. podrun's
own `configs` never takes the project's: neither a namespace portion (as in
Flax's examples) nor a regular package."""

import pathlib
import subprocess
import time

import pytest

from tests import helpers
from tests import own_project

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

STEPS = 8

_DEFAULT = '''"""The project's defaults, as Flax's configs/default.py."""

from runtime import config_base


def get_config():
  config = config_base.get_config()
  config.workload = 'train:train_and_evaluate'
  config.global_batch_size = 64
  config.steps = 100
  config.log_every = 4
  config.eval_every = 0
  config.checkpointing = False
  config.optimizer.learning_rate = 0.05
  return config
'''

# A variant, as Flax's configs/ hold beside default.py.
_SHORT = f'''from configs import default


def get_config():
  config = default.get_config()
  config.steps = {STEPS}
  return config
'''

# The deprecated spelling, in a project whose configs/ is a namespace portion.
_OLD = f'''from configs import base


def get_config():
  config = base.get_config()
  config.workload = 'train:train_and_evaluate'
  config.global_batch_size = 64
  config.steps = {STEPS}
  config.eval_every = 0
  config.checkpointing = False
  return config
'''

_TRAIN = '''import numpy as np
import optax

import runtime


def loss_fn(params, batch):
  error = batch['x'] @ params['w'] + params['b'] - batch['y']
  return (error ** 2).mean(), {}


def train_and_evaluate(config, workdir):
  rng = np.random.default_rng(3)
  x = rng.normal(size=(512, 3)).astype(np.float32)
  y = x @ np.array([1.0, -2.0, 3.0], np.float32) + 0.5
  task = runtime.Task(
      params={'w': np.zeros(3, np.float32), 'b': np.float32(0.0)},
      loss_fn=loss_fn, optimizer=optax.sgd(config.optimizer.learning_rate),
      data=runtime.ArraySource(x=x, y=y))
  return runtime.train(config, workdir, task)
'''


def _project(root: pathlib.Path, regular_package: bool) -> pathlib.Path:
  (root / 'configs').mkdir(parents=True)
  if regular_package:
    (root / 'configs' / '__init__.py').write_text('')
  (root / 'configs' / 'default.py').write_text(_DEFAULT)
  (root / 'configs' / 'short.py').write_text(_SHORT)
  (root / 'configs' / 'old.py').write_text(_OLD)
  (root / 'train.py').write_text(_TRAIN)
  return root


@pytest.fixture(scope='module')
def podrun(tmp_path_factory) -> str:
  """The `podrun` command of a wheel installed into a fresh environment
  (about 20 s)."""
  venv = own_project.wheel_venv(tmp_path_factory.mktemp('wheel'))
  return str(venv / 'bin' / 'podrun')


def _run(podrun: str, root: pathlib.Path, *flags: str) -> helpers.Result:
  env = helpers.launcher_env(PYTHONPATH='',
                             PODRUN_LOCAL_PYTHON=str(
                                 pathlib.Path(podrun).parent / 'python'))
  started = time.monotonic()
  proc = subprocess.Popen([podrun, *flags],
                          cwd=root,
                          env=env,
                          stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          text=True,
                          start_new_session=True)
  try:
    return helpers.finish(proc, 180, started)
  finally:
    helpers.kill_group(proc)


@pytest.mark.parametrize('regular_package', [False, True],
                         ids=['namespace', 'regular'])
def test_a_flax_layout_runs_on_1x8_and_2x4(podrun, tmp_path, regular_package):
  """About 30 s: two runs of a project, from a wheel's `podrun`."""
  root = _project(tmp_path / 'example', regular_package)
  for shape in (['--local_devices=8'],
                ['--local_processes=2', '--local_devices=4']):
    result = _run(podrun, root, '--config=configs/short.py', *shape,
                  f'--workdir={tmp_path / "work" / str(len(shape))}')
    assert result.returncode == 0, result.output
    assert f'step {STEPS}/{STEPS}' in result.output, result.output[-3000:]


def test_the_old_base_import_works_with_a_warning(podrun, tmp_path):
  root = _project(tmp_path / 'example', regular_package=False)
  result = _run(podrun, root, '--config=configs/old.py',
                f'--workdir={tmp_path / "work"}')
  assert result.returncode == 0, result.output
  assert '`from configs import base` is deprecated' in result.stderr
  assert 'from runtime import config_base' in result.stderr
