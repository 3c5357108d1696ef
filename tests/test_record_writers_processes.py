"""Who really writes each file of the record, against what
runtime/common/layout.py says (`writer`): the same short job run by hand,
by hand as a launcher's process (PODRUN_LAUNCHER_RECORD=1), and as a local
pod, whose launcher then adds what the process left to it."""

import json
import pathlib
import re

import pytest

from runtime.common import layout
from tests import helpers

pytestmark = pytest.mark.processes

ARGS = [
    f'--config={helpers.PROBE_CONFIG}', '--config.steps=10',
    '--config.checkpoint_every=5'
]
# Written by orbax and by JAX's compilation cache, each process its part,
# and kept out of the record's mirror: not the record's files.
NOT_THE_RECORD = (f'{layout.CHECKPOINTS}/', f'{layout.COMPILATION_CACHE}/')


def _written(workdir: pathlib.Path) -> set[str]:
  """The record's files under `workdir`, relative with '/', each attempt's
  ledger folder named A and each event file E (every run names its own)."""
  out = set()
  for path in workdir.rglob('*'):
    relative = path.relative_to(workdir).as_posix()
    if path.is_file() and not relative.startswith(NOT_THE_RECORD):
      relative = re.sub(r'^goodput/[^/]+/', 'goodput/A/', relative)
      out.add(re.sub(r'/events\.out\.tfevents\.[^/]*$', '/E', relative))
  return out


def _run(tmp_path, name: str, *extra: str, **env: str) -> set[str]:
  result = helpers.run_launcher([*ARGS, *extra, f'--workdir={tmp_path}/{name}'],
                                env=helpers.launcher_env(**env))
  assert result.returncode == 0, result.output
  return _written(tmp_path / name)


def _summary_goodput(tmp_path, name: str):
  with open(tmp_path / name / layout.SUMMARY) as f:
    return json.load(f)['goodput']


def test_each_side_writes_what_the_layout_says(tmp_path):
  """About 10 s: three runs of 10 steps."""
  # By hand, no launcher over it: process 0 writes the launcher's roll-up
  # and summary.json too, the one exception.
  alone = _run(tmp_path, 'alone')
  assert {layout.ROLLUP, layout.SUMMARY, layout.RUN} <= alone, alone
  assert {layout.writer(f, launcher_record=False) for f in alone} == {0}
  assert _summary_goodput(tmp_path, 'alone')['attempts'] == 1
  # A launcher's process: nothing of the launcher's.
  process = _run(tmp_path, 'process', PODRUN_LAUNCHER_RECORD='1')
  assert {layout.writer(f, launcher_record=True) for f in process} == {0}
  assert process == alone - {layout.ROLLUP, layout.SUMMARY}
  # A local pod of that one process: the launcher added its files alone.
  pod = _run(tmp_path, 'pod', '--local_processes=1')
  assert pod >= process
  added = pod - process
  assert {layout.writer(f, launcher_record=True) for f in added
         } == {layout.LAUNCHER}, added
  assert added == {*layout.LAUNCHER_FILES, 'logs/rank_0.log'}
  assert _summary_goodput(tmp_path, 'pod')['attempts'] == 1
