"""The ledger's notes and the launcher's attempts, written and read back."""

import json

import pytest

from runtime.common import goodput
from runtime.common import layout
from runtime.common import records
from tests import helpers

pytestmark = pytest.mark.unit


def test_notes_round_trip_with_their_nested_records():
  notes = records.Notes(attempt='a1',
                        restore_tier='peer',
                        restore_step=440,
                        fault=records.Fault(at=1.0,
                                            detected=1.5,
                                            process_index=2,
                                            kind='lost'),
                        first_productive=records.FirstProductive(
                            3.0, 441, {'startup': 1.0}))
  text = json.dumps(notes.to_json())
  assert 'exit_code' not in json.loads(text)  # Unset notes are left out.
  assert records.Notes.from_json(json.loads(text)) == notes
  # A ledger an older version wrote: unknown fields are ignored.
  assert records.Notes.from_json({'last_step': 7, 'old': 1}).last_step == 7
  assert records.Notes.from_json(None) == records.Notes()


def test_the_ledger_refuses_a_note_the_record_does_not_define():
  ledger = goodput.Ledger()
  ledger.note(restore_tier='local', last_step=3)
  assert ledger.record(final=False)['notes'] == {
      'restore_tier': 'local',
      'last_step': 3
  }
  with pytest.raises(TypeError, match='no note .restore_teir.'):
    ledger.note(restore_teir='local')


def test_attempts_are_appended_and_read_back(tmp_path):
  first = records.LauncherAttempt(started=10.0,
                                  ended=20.0,
                                  attempt=1,
                                  exit_code=137,
                                  kind='retryable',
                                  name='a1',
                                  fault=records.Fault(at=19.0,
                                                      detected=19.2,
                                                      process_index=1,
                                                      exit_code=137))
  second = records.LauncherAttempt(started=21.0,
                                   ended=40.0,
                                   attempt=2,
                                   exit_code=0,
                                   kind='ok',
                                   infrastructure=records.Recreate(
                                       'node PREEMPTED', 20.0, 20.1, 30.0, 31.0,
                                       11.0))
  records.append_attempt(str(tmp_path), first)
  records.append_attempt(str(tmp_path), second)
  path = str(tmp_path / layout.ATTEMPTS)
  assert records.read_attempts(path) == [first, second]
  assert records.read_attempts(path)[1].recreate_s == 11.0
  line = json.loads(open(path).read().splitlines()[1])
  assert line['infrastructure']['seconds'] == 11.0
  assert records.read_attempts(str(tmp_path / 'missing.jsonl')) == []


def test_summary_json_is_run_json_with_the_goodput_over_every_attempt(tmp_path):
  """Process 0 writes run.json, the launcher summary.json from it: one
  writer each."""
  workdir = str(tmp_path)
  goodput_of = lambda g: {
      'wall_s': 10.0,
      'goodput': g,
      'capacity_goodput': g,
      'reduced_size_s': 0.0,
      'parts': {
          'productive': 10.0 * g
      },
      'attempts': 1
  }
  record = layout.Record(workdir)
  assert records.with_goodput(record, goodput_of(0.5)) is None
  assert not (tmp_path / 'summary.json').exists()  # No run finished.
  path = records.write_run(record, {'workload': 'w', 'steps': 4})
  assert path == str(tmp_path / 'run.json')
  records.with_goodput(record, goodput_of(0.5))
  records.with_goodput(record, goodput_of(0.75))  # After a later attempt.
  written = json.loads((tmp_path / 'summary.json').read_text())
  assert written == {'workload': 'w', 'steps': 4, 'goodput': goodput_of(0.75)}
  assert json.loads((tmp_path / 'run.json').read_text()) == {
      'workload': 'w',
      'steps': 4
  }


def test_job_json_has_one_shape_from_every_launcher(tmp_path):
  """The local pod, Ray and the TPU driver each write a records.Job: the
  same fields first, then what only that launcher knows."""
  job = records.Job(job_id='j',
                    launched_by='podrun-ray',
                    attempt=2,
                    attempt_name='j-a2',
                    coordinator_address='10.0.0.1:8476',
                    ranks=({
                        'rank': 0,
                        'pid': 7,
                        'node': 'n0'
                    },),
                    launcher={'ray_address': 'auto'})
  path = tmp_path / 'job.json'
  job.write(str(path))
  assert json.loads(path.read_text()) == {
      'job_id': 'j',
      'launched_by': 'podrun-ray',
      'attempt': 2,
      'attempt_name': 'j-a2',
      'coordinator_address': '10.0.0.1:8476',
      'ranks': [{
          'rank': 0,
          'pid': 7,
          'node': 'n0'
      }],
      'ray_address': 'auto'
  }
  # The end of a launch: its exit code, nothing unknown written as null.
  assert records.Job('j', 'launch_tpu_pod', exit_code=0).as_json() == {
      'job_id': 'j',
      'launched_by': 'launch_tpu_pod',
      'ranks': [],
      'exit_code': 0
  }


def test_every_job_json_is_written_as_a_job():
  writers = []
  for path in sorted((helpers.REPO / 'launcher').rglob('*.py')):
    for number, line in enumerate(path.read_text().splitlines(), 1):
      if '.job()' in line and '.write(' not in line:
        writers.append(f'{path.relative_to(helpers.REPO)}:{number}')
  assert not writers, writers
