"""A user's own project, written into a directory outside the checkout: what
the tests launch on hosts that do not share this machine's disk.

  my_project/
    my_config.py      starts from configs.base; names regress.train
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

import numpy as np

CONFIG = 'my_config.py'
STEPS = 12

_CONFIG = f'''"""A project of a user's own: cd my_project && podrun --config={CONFIG}"""

from configs import base


def get_config():
  config = base.get_config()
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
  np.savetxt(root / 'data' / 'points.csv', np.column_stack([x, y]),
             delimiter=',', fmt='%.6f')
  return root
