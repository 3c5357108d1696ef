"""The obituary: a process's end written into its ledger however it ends."""

import json
import subprocess
import sys
import time

import pytest

from launcher.process import obituary
from tests import helpers

pytestmark = pytest.mark.unit


def _ledger(path, final):
  path.write_text(
      json.dumps({
          'started': 100.0,
          'updated': 108.0,
          'final': final,
          'parts': {
              'startup': 1.0,
              'productive': 5.0,
              'other': 2.0
          },
          'notes': {
              'attempt': 'a1',
              'last_step': 40
          }
      }))


def test_what_faulthandler_wrote_names_the_end():
  assert obituary.classify(
      b'Fatal Python error: Aborted\n\nThread ...')[0] == 134
  assert obituary.classify(b'Fatal Python error: Segmentation fault')[0] == 139
  code, cause = obituary.classify(b'')
  assert code == 137 and cause.startswith('killed without a trace')


def test_an_unwritten_end_is_written_and_a_written_one_kept(tmp_path):
  path = tmp_path / 'rank_1.json'
  _ledger(path, final=False)
  cause = obituary.record_end(str(path), 1, 110.0,
                              b'Fatal Python error: Aborted\n')
  assert cause.startswith('aborted (SIGABRT)')
  ledger = json.loads(path.read_text())
  assert ledger['updated'] == 110.0 and not ledger['final']
  assert ledger['notes']['exit_code'] == 134
  assert ledger['notes']['last_step'] == 40  # What it knew stays.
  assert ledger['notes']['fault'] == {
      'at': 110.0,
      'detected': 110.0,
      'rank': 1,
      'kind': 'aborted',
      'exit_code': 134
  }
  # Its whole life is accounted for: 10 s, the unrecorded end in 'other'.
  assert sum(ledger['parts'].values()) == pytest.approx(10.0)
  _ledger(path, final=True)
  before = path.read_text()
  assert obituary.record_end(str(path), 1, 110.0, b'') is None
  assert path.read_text() == before
  assert obituary.record_end(str(tmp_path / 'none.json'), 1, 1.0, b'') is None


def test_what_it_writes_reads_back_as_the_records_types(tmp_path):
  """It runs under `python -S` without the project, so it writes the
  fields itself; records.Notes and records.Fault read them back whole."""
  from runtime.common import records  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'rank_2.json'
  _ledger(path, final=False)
  obituary.record_end(str(path), 2, 110.0, b'')
  written = json.loads(path.read_text())['notes']
  notes = records.Notes.from_json(written)
  assert notes.fault == records.Fault(kind='killed',
                                      process_index=2,
                                      exit_code=137,
                                      at=110.0,
                                      detected=110.0)
  assert (notes.exit_code, notes.last_step) == (137, 40)
  assert notes.cause.startswith('killed without a trace')
  # Nothing it wrote is a field the records do not have.
  assert notes.to_json() == written


_PARENT = '''
import os, subprocess, sys, time
read_fd, write_fd = os.pipe()
child = subprocess.Popen([sys.executable, '-c', {child!r}, str(read_fd)],
                         pass_fds=(read_fd,))
os.close(read_fd)
os.write(write_fd, b'Fatal Python error: Aborted\\n')
time.sleep(0.5)
os._exit(0)  # Without waiting for the child: it watches this end.
'''

_CHILD = '''
import json, os, sys, time
sys.path.insert(0, {repo!r})
from launcher.process import obituary
def no_pidfd(pid):
  raise OSError(38, 'Function not implemented')
os.pidfd_open = no_pidfd
ended, traceback = obituary._watch(os.getppid(), int(sys.argv[1]))
with open({out!r}, 'w') as f:
  json.dump({{'ended': ended, 'traceback': traceback.decode()}}, f)
'''


def test_without_pidfd_the_end_is_seen_by_the_parent_changing(tmp_path):
  """Where os.pidfd_open is not implemented (a TPU VM's container), the
  watcher notices its process's end within a second anyway."""
  out = tmp_path / 'seen.json'
  child = _CHILD.format(repo=str(helpers.REPO), out=str(out))
  started = time.time()
  subprocess.run(
      [sys.executable, '-c', _PARENT.format(child=child)],
      timeout=30,
      check=True)
  assert helpers.wait_for(out.exists, 10)
  seen = json.loads(out.read_text())
  assert seen['traceback'] == 'Fatal Python error: Aborted\n'
  assert seen['ended'] - started < 5
