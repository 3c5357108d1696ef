"""A user's own project, written into a directory outside the checkout: what
the tests launch on hosts that do not share this machine's disk.

  my_project/
    my_config.py      starts from runtime.config_base; names regress.train
    regress/
      __init__.py
      model.py        the parameters and the loss
      train.py        imports model; reads data/points.csv by a relative path
    data/points.csv   the data set (x1, x2, x3, y), 512 rows

Nothing in it is importable from the checkout: a process finds it only when
it runs from the project's own copy on its host. Its workload says where it
runs from (`regress: running from DIR`, an INFO line of every process).

Example:
  >>> root = write(tmp_path / 'my_project')
  >>> # cd root && podrun --config=my_config.py
"""

import pathlib
import shutil
import subprocess
import sys
import sysconfig

import numpy as np

from launcher.common import project
from tests import helpers

CONFIG = 'my_config.py'
STEPS = 12

_CONFIG = f'''"""A project of a user's own: cd my_project && podrun --config={CONFIG}"""

from runtime import config_base


def get_config():
  config = config_base.get_config()
  config.workload = 'regress.train:train_and_evaluate'
  config.data.path = 'data/points.csv'
  config.global_batch_size = 64
  config.steps = {STEPS}
  config.log_every = 4
  config.eval_every = 0
  config.checkpoint_every = {STEPS}
  config.optimizer.learning_rate = 0.05
  return config
'''

_MODEL = '''"""The model: y = x . w + b."""

import numpy as np


def init_params():
  return {'w': np.zeros(3, np.float32), 'b': np.float32(0.0)}


def loss_fn(params, batch):
  error = batch['x'] @ params['w'] + params['b'] - batch['y']
  return (error ** 2).mean(), {}
'''

_TRAIN = '''"""The workload: reads the data where the project's config says,
relative to the directory the job runs from, and says which that is."""

import os

from absl import logging
import numpy as np
import optax

import runtime
from regress import model


def train_and_evaluate(config, workdir):
  logging.info('regress: running from %s', os.getcwd())
  table = np.loadtxt(config.data.path, delimiter=',', dtype=np.float32)
  task = runtime.Task(params=model.init_params(), loss_fn=model.loss_fn,
                      optimizer=optax.sgd(config.optimizer.learning_rate),
                      data=runtime.ArraySource(x=table[:, :3], y=table[:, 3]))
  return runtime.train(config, workdir, task)
'''


def write(root) -> pathlib.Path:
  """Writes the project into `root` (created); returns it."""
  root = pathlib.Path(root)
  (root / 'regress').mkdir(parents=True)
  (root / 'data').mkdir()
  (root / CONFIG).write_text(_CONFIG)
  (root / 'regress' / '__init__.py').write_text('')
  (root / 'regress' / 'model.py').write_text(_MODEL)
  (root / 'regress' / 'train.py').write_text(_TRAIN)
  rng = np.random.default_rng(7)
  x = rng.normal(size=(512, 3)).astype(np.float32)
  y = x @ np.array([1.0, -2.0, 3.0], np.float32) + 0.5
  np.savetxt(root / 'data' / 'points.csv',
             np.column_stack([x, y]),
             delimiter=',',
             fmt='%.6f')
  return root


def wheel_venv(tmp_path) -> pathlib.Path:
  """A fresh virtual environment with podrun installed from a wheel built
  from the checkout's files (no -e: nothing of the checkout on its path);
  the test environment's site-packages give it the dependencies."""
  source = tmp_path / 'source'
  for name in project.listed_files(str(helpers.REPO)):
    target = source / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(helpers.REPO / name, target)
  wheels = tmp_path / 'wheels'
  pip = [sys.executable, '-m', 'pip', '--disable-pip-version-check', '-q']
  subprocess.run([
      *pip, 'wheel', '--no-deps', '--no-build-isolation', '-w',
      str(wheels),
      str(source)
  ],
                 check=True,
                 timeout=180,
                 cwd=tmp_path)
  wheel, = wheels.glob('podrun-*.whl')
  venv = tmp_path / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip',
                  str(venv)],
                 check=True,
                 timeout=60)
  python = venv / 'bin' / 'python'
  subprocess.run([
      *pip, '--python',
      str(python), 'install', '--no-deps', '--no-index',
      str(wheel)
  ],
                 check=True,
                 timeout=120)
  site, = venv.glob('lib/python*/site-packages')
  # A path line of a .pth file is appended after site-packages, and that
  # directory's own .pth files (the checkout's editable install) are not
  # read: the deps come from there, podrun from the wheel.
  (site / 'test_deps.pth').write_text(sysconfig.get_paths()['purelib'] + '\n')
  return venv
