"""The README's sequence in one workdir: a run, then the same job on a
local pod. A run whose checkpoint is already at config.steps trains nothing,
says so with the two ways on, and leaves the record as it was; a resume on
another topology says so in one line."""

import pytest

from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

_JOB = ['--config=configs/linear_regression.py', '--config.steps=20']
_POD = ['--local_processes=2', '--local_devices=4']


def test_a_rerun_at_the_last_step_trains_nothing_and_keeps_the_record(tmp_path):
  first = helpers.run_launcher([*_JOB, f'--workdir={tmp_path}'])
  assert first.returncode == 0, first.output[-3000:]
  summary = _without_goodput(tmp_path)
  metrics = (tmp_path / 'metrics.jsonl').read_text()
  again = helpers.run_launcher([*_JOB, *_POD, f'--workdir={tmp_path}'])
  assert again.returncode == 0, again.output[-3000:]
  line = helpers.first_line_with(again.output, 'nothing to train')
  assert line and 'is already at step 20 of config.steps=20' in line, (
      again.output[-3000:])
  assert 'another --workdir' in line and 'raise --config.steps' in line
  assert 'summary.json left as it was' in again.output
  # What the processes wrote stays; the launcher's goodput roll-up counts
  # the job's attempts, this one among them.
  assert _without_goodput(tmp_path) == summary
  assert (tmp_path / 'metrics.jsonl').read_text() == metrics
  assert helpers.read_json(tmp_path / 'summary.json')['process_count'] == 1


def _without_goodput(workdir) -> dict:
  summary = helpers.read_json(workdir / 'summary.json')
  summary.pop('goodput')
  return summary


def test_a_resume_on_another_topology_says_so(tmp_path):
  first = helpers.run_launcher([*_JOB, f'--workdir={tmp_path}'])
  assert first.returncode == 0, first.output[-3000:]
  more = helpers.run_launcher([
      '--config=configs/linear_regression.py', '--config.steps=40', *_POD,
      f'--workdir={tmp_path}'
  ])
  assert more.returncode == 0, more.output[-3000:]
  assert ('the checkpoint of step 20 was saved by 1 process(es) on 8 '
          'device(s); this run resumes it on 2 process(es), 8 device(s)'
          in more.output), more.output[-3000:]
  assert helpers.read_json(tmp_path / 'summary.json')['process_count'] == 2
