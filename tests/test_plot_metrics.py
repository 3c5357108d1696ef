"""scripts/plot_metrics.py draws a PNG from a run's metrics.jsonl."""

import json
import subprocess
import sys

import numpy as np

import pytest

from tests import helpers

pytestmark = pytest.mark.unit

SCRIPT = str(helpers.REPO / 'scripts' / 'plot_metrics.py')


def _write(workdir, records):
  workdir.mkdir(parents=True, exist_ok=True)
  with open(workdir / 'metrics.jsonl', 'w') as f:
    for r in records:
      f.write(json.dumps(r) + '\n')


def _run(*args):
  return subprocess.run([sys.executable, SCRIPT, *args],
                        capture_output=True,
                        text=True,
                        timeout=120,
                        check=False)


def test_loss_and_accuracy_with_eval_points(tmp_path):
  records = [{
      'step': s,
      'loss': 2.0 / s,
      'accuracy': 1 - 1 / s
  } for s in range(10, 110, 10)]
  records += [{
      'step': 50,
      'eval_loss': 0.1,
      'eval_accuracy': 0.9
  }, {
      'step': 100,
      'eval_loss': 0.05,
      'eval_accuracy': 0.95
  }]
  _write(tmp_path, records)
  result = _run(str(tmp_path))
  assert result.returncode == 0, result.stderr
  assert 'loss, eval_loss, accuracy, eval_accuracy' in result.stdout
  png = (tmp_path / 'metrics.png').read_bytes()
  assert png.startswith(b'\x89PNG\r\n\x1a\n')
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  image = matplotlib.image.imread(tmp_path / 'metrics.png')
  # Two panels, drawn in more than one colour.
  assert image.shape[0] > image.shape[1] * 0.8
  assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 10


def test_loss_only_to_a_chosen_file(tmp_path):
  _write(tmp_path / 'run', [{
      'step': s,
      'loss': 1.0 - s / 100
  } for s in range(1, 50)])
  result = _run(str(tmp_path / 'run'), f'--out={tmp_path / "x.png"}')
  assert result.returncode == 0, result.stderr
  assert '(loss)' in result.stdout
  assert (tmp_path / 'x.png').read_bytes().startswith(b'\x89PNG')


def test_missing_metrics_names_the_file(tmp_path):
  result = _run(str(tmp_path))
  assert result.returncode == 2
  assert f'{tmp_path}/metrics.jsonl: no such file' in result.stderr
