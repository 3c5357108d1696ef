"""TensorBoard scalars flushed before a SIGKILL survive it."""

import pytest

from runtime.common import layout
from tests import helpers
from tests.test_tensorboard import _scalars

pytestmark = pytest.mark.processes


def test_flushed_scalars_survive_sigkill(tmp_path):
  helpers.run_then_sigkill(
      'import os\nfrom runtime import tensorboard\n'
      'from runtime.common import layout\n'
      f'writer = tensorboard.EventWriter(layout.Record({str(tmp_path)!r}))\n'
      'for step in range(5, 65, 5):\n'
      '  writer.scalars(step, {"loss": 1.0 / step})\n'
      '  if step % 20 == 0:\n'
      '    writer.flush()')
  steps = [s for s, _ in _scalars(tmp_path / layout.TENSORBOARD)['loss']]
  assert steps == list(range(5, 65, 5))  # Up to the last flush, at 60.
