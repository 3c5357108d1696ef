"""The goodput ledger: every second of a job accounted for, across attempts."""

import json
import subprocess
import sys
import time

import pytest

from launcher.common import goodput_rollup
from runtime.common import layout
from runtime.common import goodput
from runtime.common import records
from launcher.common import time_to_recover
from tests import helpers

pytestmark = pytest.mark.unit


def _ledger(path, started, updated, final, devices=None, **parts):
  path.parent.mkdir(parents=True, exist_ok=True)
  full = {p: 0.0 for p in goodput.PROCESS_PARTS}
  full.update(parts)
  full['other'] = updated - started - sum(
      v for k, v in full.items() if k != 'other')
  path.write_text(
      json.dumps({
          'started': started,
          'updated': updated,
          'final': final,
          'parts': full,
          'notes': {
              'last_step': 10,
              **({
                  'topology': {
                      'num_devices': devices
                  }
              } if devices else {})
          }
      }))


def test_rollup_accounts_for_every_second(tmp_path):
  # Attempt a1: 100-110 s, killed (its ledger stops at 108, the launcher
  # saw it end at 110); 3 s of back-off; attempt a2: 113.5-130, clean.
  _ledger(tmp_path / 'goodput' / 'a1' / 'rank_0.json',
          100.5,
          108,
          False,
          startup=1,
          productive=5)
  _ledger(tmp_path / 'goodput' / 'a2' / 'rank_0.json',
          113.5,
          129.5,
          True,
          startup=1,
          compile=2,
          recomputed=1,
          productive=10)
  (tmp_path / 'logs').mkdir()
  (tmp_path / 'logs' / 'attempts.jsonl').write_text(
      json.dumps({
          'name': 'a1',
          'started': 100,
          'ended': 110,
          'exit_code': 137,
          'launcher_started': 99.5
      }) + '\n' + json.dumps({
          'name': 'a2',
          'started': 113,
          'ended': 130,
          'exit_code': 0,
          'launcher_started': 99.5
      }) + '\n')
  result = goodput_rollup.rollup(layout.Record(str(tmp_path)))
  assert result['wall_s'] == pytest.approx(130 - 99.5)
  assert sum(result['parts'].values()) == pytest.approx(result['wall_s'])
  a1, a2 = result['attempts']
  assert a1['parts']['unrecorded'] == pytest.approx(2.0)  # 108 -> 110.
  assert a2['parts']['restart_backoff'] == pytest.approx(3.0)  # 110 -> 113.
  assert a1['parts']['launch_overhead'] == pytest.approx(0.5 + 0.5)
  assert result['parts']['productive'] == 15
  assert result['goodput'] == pytest.approx(15 / 30.5)


def test_capacity_goodput_weighs_each_attempt_by_its_devices(tmp_path):
  # 8 devices for 10 s (8 productive), then 6 for 10 s (9 productive), then
  # 8 again for 10 s (8 productive); one command, restarts at once.
  for name, start, devices, productive in (('a1', 0, 8, 8), ('a2', 10, 6, 9),
                                           ('a3', 20, 8, 8)):
    _ledger(tmp_path / 'goodput' / name / 'rank_0.json',
            start,
            start + 10,
            True,
            devices=devices,
            productive=productive)
  result = goodput_rollup.rollup(layout.Record(str(tmp_path)))
  assert result['goodput'] == pytest.approx(25 / 30)
  assert result['full_devices'] == 8
  assert result['reduced_size_s'] == pytest.approx(10)
  assert result['capacity_goodput'] == pytest.approx(
      (8 * 8 + 9 * 6 + 8 * 8) / (8 * 30))
  assert goodput_rollup.summary(result)['capacity_goodput'] == pytest.approx(
      result['capacity_goodput'])
  out = subprocess.run([
      sys.executable,
      str(helpers.REPO / 'scripts' / 'goodput.py'),
      str(tmp_path)
  ],
                       capture_output=True,
                       text=True,
                       timeout=120,
                       check=False)
  assert out.returncode == 0, out.stderr
  assert ('capacity-weighted goodput 0.758 (productive device-seconds / 8 '
          'devices x the wall time); 10.00 s at reduced size; devices per '
          'attempt: a1: 8, a2: 6, a3: 8') in out.stdout, out.stdout


def test_goodput_script_prints_and_draws(tmp_path):
  _ledger(tmp_path / 'goodput' / 'a1' / 'rank_0.json',
          0,
          10,
          True,
          startup=1,
          productive=8)
  _ledger(tmp_path / 'goodput' / 'a1' / 'rank_1.json',
          0,
          10,
          True,
          startup=2,
          productive=7)
  out = subprocess.run([
      sys.executable,
      str(helpers.REPO / 'scripts' / 'goodput.py'),
      str(tmp_path)
  ],
                       capture_output=True,
                       text=True,
                       timeout=120,
                       check=False)
  assert out.returncode == 0, out.stderr
  assert 'goodput 0.800' in out.stdout
  assert 'a1 rank 1' in out.stdout
  assert (tmp_path / 'goodput.png').stat().st_size > 1000


def test_time_to_recover_is_split_into_phases():
  fault = {'at': 100.0, 'detected': 100.2, 'rank': 1}
  before = {
      0: {
          'started': 50.0,
          'updated': 100.5,
          'final': False,
          'parts': {},
          'notes': {}
      }
  }
  ledger_0 = {
      'started': 102.0,
      'updated': 130.0,
      'final': True,
      'parts': {},
      'notes': {
          'restore_tier': 'peer',
          'restore_step': 440,
          'recomputed_steps': 7,
          'first_productive': {
              'wall': 105.0,
              'step': 448,
              'parts': {
                  'startup': 1.0,
                  'distributed_init': 0.2,
                  'checkpoint_restore': 0.3,
                  'compile': 0.4,
                  'recomputed': 0.5
              }
          }
      }
  }
  launch_before = {'started': 49.0, 'ended': 101.0, 'fault': fault}
  launch = {'started': 101.5, 'ended': 131.0}
  found = time_to_recover.phases(before, launch_before, 101.0, ledger_0, launch)
  assert found['total_s'] == pytest.approx(5.0)
  assert found['phases'] == pytest.approx({
      'detection': 0.2,
      'teardown': 0.8,
      'backoff': 0.5,
      'startup': 1.5,
      'distributed_init': 0.2,
      'restore': 0.3,
      'compile': 0.4,
      'recomputed': 0.5,
      'other': 0.6
  })
  assert (found['restore_tier'], found['recomputed_steps']) == ('peer', 7)


def test_without_a_launcher_the_supervisors_notice_is_the_fault():
  ranks = {
      0: {
          'notes': {
              'fault': {
                  'at': 10.0,
                  'detected': 25.0
              }
          }
      },
      1: {
          'notes': {
              'fault': {
                  'at': 10.0,
                  'detected': 24.0
              }
          }
      }
  }
  assert time_to_recover.fault_of(ranks, None) == {'at': 10.0, 'detected': 24.0}
  assert time_to_recover.fault_of({0: {'notes': {}}}, {'fault': None}) is None


def test_a_restart_at_once_never_counts_a_second_twice(tmp_path):
  # a2's process start, read from /proc in clock ticks, falls 5 ms before
  # a1's end: the overlap comes out of its start-up, not twice into the job.
  _ledger(tmp_path / 'goodput' / 'a1' / 'rank_0.json',
          100.5,
          110,
          True,
          startup=1,
          productive=5)
  _ledger(tmp_path / 'goodput' / 'a2' / 'rank_0.json',
          109.995,
          120,
          True,
          startup=1,
          productive=8)
  (tmp_path / 'logs').mkdir()
  (tmp_path / 'logs' / 'attempts.jsonl').write_text(
      json.dumps({
          'name': 'a1',
          'started': 100,
          'ended': 110,
          'exit_code': 137,
          'launcher_started': 100
      }) + '\n' + json.dumps({
          'name': 'a2',
          'started': 110.001,
          'ended': 120,
          'exit_code': 0,
          'launcher_started': 100
      }) + '\n')
  result = goodput_rollup.rollup(layout.Record(str(tmp_path)))
  assert sum(result['parts'].values()) == pytest.approx(result['wall_s'],
                                                        abs=1e-9)
  assert result['parts']['restart_backoff'] == 0
  assert result['attempts'][1]['parts']['startup'] == pytest.approx(0.995)


def _launch(name, started, ended, launcher_started, attempt=1, **more):
  return json.dumps({
      'name': name,
      'started': started,
      'ended': ended,
      'launcher_started': launcher_started,
      'attempt': attempt,
      **more
  }) + '\n'


# Two attempts, 100-110 s and 130-140 s of process life, and how they were
# started: by one launcher that waited (a restart), or by two commands (a
# person starting the job again, with the same or another topology, after
# a Ctrl-C, a SIGTERM or a failure), with or without a launcher each.
_COMMANDS = {
    'one launcher restarted it':
        (_launch('a1', 99.5, 110.5, 99, exit_code=75) +
         _launch('a2', 129.5, 140.5, 99, attempt=2, exit_code=0), 0.0, 19.0),
    'two launchers, Ctrl-C then another topology': (
        _launch('a1', 99.5, 110.5, 99, exit_code=130, launcher_signalled=True) +
        _launch('a2', 129.5, 140.5, 128, exit_code=0), 17.5, 0.0),
    'one process in-process, then a launcher':
        (_launch('a2', 129.5, 140.5, 128, exit_code=0), 18.0, 0.0),
    'a launcher SIGTERMed, then one process in-process':
        (_launch('a1', 99.5, 110.5, 99, exit_code=143,
                 launcher_signalled=True), 19.5, 0.0),
    'in-process both times': ('', 20.0, 0.0),
}


@pytest.mark.parametrize('how', sorted(_COMMANDS))
def test_the_parts_never_exceed_the_wall_time(tmp_path, how):
  attempts, between, backoff = _COMMANDS[how]
  _ledger(tmp_path / 'goodput' / 'a1' / 'rank_0.json',
          100,
          110,
          True,
          startup=1,
          productive=8)
  _ledger(tmp_path / 'goodput' / 'a2' / 'rank_0.json',
          130,
          140,
          True,
          startup=1,
          productive=8)
  (tmp_path / 'logs').mkdir()
  (tmp_path / 'logs' / 'attempts.jsonl').write_text(attempts)
  result = goodput_rollup.rollup(layout.Record(str(tmp_path)))
  assert sum(result['parts'].values()) == pytest.approx(result['wall_s'])
  assert result['goodput'] <= 1.0
  assert result['parts']['productive'] == 16
  assert result['between_commands_s'] == pytest.approx(between)
  assert result['parts']['restart_backoff'] == pytest.approx(backoff)
  for attempt in result['attempts']:
    assert sum(attempt['parts'].values()) == pytest.approx(attempt['wall_s'])


def test_an_attempt_whose_processes_all_died_unrecorded_still_recovers():
  # Rank 0 SIGKILLed (its ledger last written at 100.0); rank 1 aborted by
  # JAX's coordination service moments later (last written at 100.4):
  # neither wrote an end, and no launcher ran them.
  before = {
      0: {
          'started': 50.0,
          'updated': 100.0,
          'final': False,
          'parts': {},
          'notes': {}
      },
      1: {
          'started': 50.0,
          'updated': 100.4,
          'final': False,
          'parts': {},
          'notes': {}
      }
  }
  ledger_0 = {
      'started': 102.0,
      'updated': 130.0,
      'final': True,
      'parts': {},
      'notes': {
          'restore_tier': 'local',
          'first_productive': {
              'wall': 105.0,
              'step': 448,
              'parts': {
                  'startup': 1.0,
                  'distributed_init': 0.2,
                  'checkpoint_restore': 0.3,
                  'compile': 0.4,
                  'recomputed': 0.5
              }
          }
      }
  }
  assert time_to_recover.fault_of(before, None) == {
      'at': 100.0,
      'detected': 100.4,
      'rank': 0,
      'kind': 'unrecorded'
  }
  found = time_to_recover.phases(before, None, 100.4, ledger_0, None)
  assert found['total_s'] == pytest.approx(5.0)
  assert found['total_s'] == pytest.approx(sum(found['phases'].values()))
  assert found['phases']['detection'] == pytest.approx(0.4)
  # An attempt that one process ended in order is not guessed at.
  before[1]['final'] = True
  assert time_to_recover.fault_of(before, None) is None


def test_named_pieces_of_other_stay_in_other_with_their_names():
  ledger = goodput.Ledger(process_start=time.time() - 10)
  with ledger.naming('agreement'):
    time.sleep(0.02)
  ledger.name_other('lease', 0.5)
  ledger.name_other('lease', 0.25)
  ledger.mark('workload')
  ledger.name_since('workload', 'workload_setup')
  ledger.name_since('never marked', 'results')  # Nothing: no mark.
  record = ledger.record(final=False)
  assert record['parts']['other'] >= 10  # Named, not taken out of other.
  named = record['other_named']
  assert sorted(named) == ['agreement', 'lease', 'workload_setup']
  assert named['lease'] == 0.75 and named['agreement'] >= 0.02
  with pytest.raises(ValueError, match="unknown name 'lunch'"):
    ledger.name_other('lunch', 1.0)


def test_a_named_piece_leaves_out_what_other_parts_took_meanwhile():
  ledger = goodput.Ledger()
  with ledger.naming('workload_import'):
    time.sleep(0.05)
    ledger.add('compile', 0.04)  # A compilation the import triggered.
  assert ledger.other_named['workload_import'] < 0.04


def test_a_step_cut_short_is_named_when_the_clock_closes():
  ledger = goodput.Ledger()
  clock = goodput.StepClock(ledger, steps_done_before=0)
  clock.step_done(1)
  time.sleep(0.05)  # Step 2 under way when a peer fails.
  clock.take('input_wait', 0.01)
  clock.close()
  assert 0.03 < ledger.other_named['loop_end'] < 1.0
  assert ledger.clock is None


def test_a_call_across_the_high_water_splits_its_time_by_steps():
  # Steps 3-6 in one call, 1-4 trained before: two recomputed, two new.
  ledger = goodput.Ledger()
  clock = goodput.StepClock(ledger, steps_done_before=4)
  clock.step_done(2)
  time.sleep(0.08)
  clock.step_done(6, steps=4)
  assert clock.recomputed_steps == 3
  # The call's 0.08 s in halves (step 2's share, before it, is ~0).
  assert 0.035 < ledger.parts['productive'] < 1.0
  assert ledger.parts['recomputed'] == pytest.approx(ledger.parts['productive'],
                                                     abs=0.01)
  assert ledger.notes.first_productive.step == 5
  assert ledger.notes.first_step.step == 2
  assert ledger.notes.last_step == 6


def test_a_final_record_inside_the_loop_names_the_step_under_way():
  """A process that ends from another thread (a peer's failure) writes its
  last ledger with the loop still running."""
  ledger = goodput.Ledger()
  goodput.StepClock(ledger, steps_done_before=0).step_done(1)
  time.sleep(0.05)
  assert 'loop_end' not in ledger.record(final=False)['other_named']
  assert ledger.record(final=True)['other_named']['loop_end'] > 0.03


def test_the_time_to_recover_carries_what_of_other_had_a_name():
  ledger = goodput.Ledger()
  ledger.name_other('record_fetch', 0.3)
  clock = goodput.StepClock(ledger, steps_done_before=2)
  clock.step_done(3)  # The first new step.
  first = ledger.notes.first_productive
  assert first.other_named == {'record_fetch': 0.3}
  before = {
      0: {
          'started': 50.0,
          'updated': 100.0,
          'final': False,
          'parts': {},
          'notes': {}
      }
  }
  ledger_0 = {
      'started': 102.0,
      'updated': 130.0,
      'final': True,
      'parts': {},
      'notes': ledger.notes.to_json()
  }
  found = time_to_recover.phases(before, None, 100.0, ledger_0, None)
  assert found['other_named'] == {'record_fetch': 0.3}
  # A ledger of an older version names nothing.
  old = records.Notes.from_json(
      {'first_productive': {
          'wall': 1.0,
          'step': 3,
          'parts': {}
      }})
  assert old.first_productive.other_named is None


def test_a_start_cut_short_has_a_ledger_of_start_up_and_its_end():
  ledger = goodput.ledger_of_a_start_cut_short('job-a2', 1, 100.0, 100.5, 137)
  assert ledger['parts']['startup'] == 0.5
  assert sum(ledger['parts'].values()) == 0.5
  assert set(ledger['parts']) == set(goodput.PROCESS_PARTS)
  assert ledger['notes']['attempt'] == 'job-a2'
  assert ledger['notes']['exit_code'] == 137
  assert 'SIGKILL' in ledger['notes']['cause']
  assert not ledger['final']


def test_the_failure_history_counts_the_hard_failures_of_earlier_attempts(
    tmp_path):
  # Four earlier attempts: a SIGKILL (its obituary wrote 137), one whose
  # ledger never wrote an end, a Ctrl-C (130: someone's decision) and a
  # clean end; 100 s each.
  def write(name, final, exit_code):
    path = tmp_path / 'goodput' / name / 'rank_0.json'
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps({
            'started': 1000.0,
            'updated': 1100.0,
            'final': final,
            'notes': {
                'exit_code': exit_code
            }
        }))

  write('a1', True, 137)
  write('a2', False, None)
  write('a3', True, 130)
  write('a4', True, 0)
  ledger = goodput.Ledger(process_start=2000.0)
  ledger.path = str(tmp_path / 'goodput' / 'a5' / 'rank_0.json')
  assert goodput.failure_history(ledger) == (2, 400.0)
  assert goodput.failure_history(goodput.Ledger()) == (0, 0.0)


def test_a_compile_inside_a_timed_block_is_counted_once():
  """A save whose copy program compiles 0.3 s in the loop's thread: the
  compile goes to 'compile' (on_compile) and the rest of the block to its
  category, so the parts add up to the loop's wall time and the step keeps
  its share."""
  ledger = goodput.Ledger()
  compiled = [0.0]
  clock = goodput.StepClock(ledger,
                            steps_done_before=0,
                            compiled_here=lambda: compiled[0])
  started = time.perf_counter()
  with clock.timing('checkpoint_blocking'):
    time.sleep(0.4)
    compiled[0] += 0.3  # This thread compiled for 0.3 s of the 0.4.
    clock.take('compile', 0.3)  # As goodput.on_compile does.
  time.sleep(0.1)  # The step itself.
  clock.step_done(1)
  wall = time.perf_counter() - started
  parts = ledger.parts
  assert parts['compile'] == pytest.approx(0.3)
  assert 0.09 < parts['checkpoint_blocking'] < 0.3, parts
  assert 0.09 < parts['productive'] < 0.3, parts
  assert sum(parts.values()) == pytest.approx(wall, abs=0.02), parts
  assert clock.paused_here() == pytest.approx(parts['checkpoint_blocking'] +
                                              0.3)


def test_a_script_that_execs_python_starts_the_ledger_at_its_exec(tmp_path):
  # scripts/run.sh installs for a minute, then execs Python in its own
  # process: the ledger starts at the exec, not at the script's start.
  import os  # pylint: disable=g-import-not-at-top
  pid = os.getpid()
  assert goodput.process_start_time({'PODRUN_EXEC': f'{pid}:1234.5'}) == 1234.5
  # Another process's (a child inherits the variable): the kernel's time.
  assert goodput.process_start_time({'PODRUN_EXEC': f'{pid + 1}:1234.5'
                                    }) > 1234.5
  assert goodput.process_start_time({'PODRUN_EXEC': 'nonsense'}) > 1234.5
  # Through the script, as a user runs it: a pause before the exec (the
  # install's stand-in) is not booked as the run's.
  script = tmp_path / 'run.sh'
  script.write_text('sleep 2\nexport PODRUN_EXEC="$$:$(date +%s.%N)"\n'
                    f'exec {sys.executable} -c "'
                    'from runtime.common import goodput; '
                    'print(goodput.process_start_time() - '
                    'goodput.process_start_time({}))"\n')
  done = subprocess.run(['bash', str(script)],
                        cwd=helpers.REPO,
                        env=helpers.launcher_env(),
                        capture_output=True,
                        text=True,
                        check=True,
                        timeout=60)
  # The exec came at least the pause after the script's start.
  assert float(done.stdout) >= 1.9, done.stdout


def test_a_bucket_without_gcsfs_is_one_line(monkeypatch, capsys):
  """podrun-goodput gs://...: the extra to install and exit 2, as
  podrun-fetch-mnist says it, not gcs_auth's traceback."""
  from launcher import goodput_report  # pylint: disable=g-import-not-at-top
  monkeypatch.setitem(sys.modules, 'gcsfs', None)  # As if not installed.
  assert goodput_report.main(['gs://bucket/job']) == 2
  said = capsys.readouterr().err
  assert said.startswith("podrun-goodput: error: gs://bucket/job: a bucket "
                         "needs gcsfs, which is not installed: pip install "
                         "-e '.[gcs]'"), said
