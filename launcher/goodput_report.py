"""Where a job's time went: the goodput ledger as a table and a picture.

  podrun-goodput WORKDIR [--out=WORKDIR/goodput.png]
      [--attempts=tpu_logs/JOB/attempts.jsonl]
  podrun-goodput gs://BUCKET/RUN      # a workdir in a bucket

(`python scripts/goodput.py ...` in a checkout runs the same.)

Reads the ledgers every process of every attempt wrote under
WORKDIR/goodput/ (and the launcher's WORKDIR/logs/attempts.jsonl, or
--attempts: the TPU pod driver keeps it in its LOG_DIR), rolls
them up (runtime/common/goodput.py), rewrites WORKDIR/goodput.jsonl, prints
one row per attempt and one per process of each attempt (seconds per category), and
draws a stacked bar per attempt with every kind of lost time named; after
a failure, the next attempt's time to recover in phases (detection,
teardown, back-off, start-up, distributed init, restore and its tier,
compile, recomputed steps). A gs:// workdir is first copied to a temporary
directory (launcher/common/record_mirror.py), where the picture goes too.
"""

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from typing import Sequence

from launcher.common import goodput_rollup
from runtime.common import copy_interval
from runtime.common import goodput
from launcher.common import record_mirror
from runtime.common import layout
from runtime.common import records
from launcher.common import time_to_recover

PARTS = goodput.PROCESS_PARTS + goodput.JOB_PARTS
_SHORT = {
    'distributed_init': 'dist_init',
    'checkpoint_restore': 'restore',
    'checkpoint_blocking': 'ckpt_block',
    'preemption_save': 'preempt',
    'launch_overhead': 'launch',
    'restart_backoff': 'backoff',
    'input_wait': 'input',
    'evaluation': 'eval',
    'recomputed': 'recomputed',
    'unrecorded': 'unrecorded',
    'infrastructure_recovery': 'infra'
}


def table(rows: list[tuple[str, dict[str, float]]], first: str) -> str:
  """Fixed-width text: one row per (label, parts), a column per category."""
  names = [_SHORT.get(p, p) for p in PARTS]
  widths = [max(len(n), 8) for n in names]
  head = f'{first:<14}' + ''.join(
      f'{n:>{w + 1}}' for n, w in zip(names, widths))
  lines = [head + f'{"total":>9}']
  for label, parts in rows:
    values = [parts.get(p, 0.0) for p in PARTS]
    lines.append(f'{label:<14}' +
                 ''.join(f'{v:>{w + 1}.2f}' for v, w in zip(values, widths)) +
                 f'{sum(values):>9.2f}')
  return '\n'.join(lines)


def capacity_line(result: records.RollUp) -> str:
  """The job at reduced size: how long, and the goodput by device-seconds."""
  if result.get('capacity_goodput') is None:
    return 'capacity-weighted goodput: no attempt noted its devices'

  def devices(attempt: records.AttemptRow):
    notes = attempt['notes'] or {}
    return (notes.get('topology') or {}).get('num_devices', '?')

  sizes = ', '.join(
      f'a{a["attempt"]}: {devices(a)}' for a in result['attempts'])
  return (f'capacity-weighted goodput {result["capacity_goodput"]:.3f} '
          f'(productive device-seconds / {result["full_devices"]} devices x '
          f'the wall time); {result["reduced_size_s"]:.2f} s at reduced size; '
          f'devices per attempt: {sizes}')


def recovery_table(attempts: Sequence[records.AttemptRow]) -> str:
  """One row per attempt after a failure: its time to recover in phases,
  the tier it restored from and the steps it trained again ('' if none)."""
  rows = [(a, r) for a in attempts if (r := a.get('recovery'))]
  if not rows:
    return ''
  phases = time_to_recover.PHASES
  names = [_SHORT.get(p, p) for p in phases]
  lines = [
      f'{"attempt":<10}' + ''.join(f'{n:>11}' for n in names) +
      f'{"total":>9}  restored from'
  ]
  for a, r in rows:
    lines.append(f'{a["attempt"]:<10}' +
                 ''.join(f'{r["phases"][p]:>11.2f}' for p in phases) +
                 f'{r["total_s"]:>9.2f}  {r["restore_tier"]} step '
                 f'{r["restore_step"]}, {r["recomputed_steps"]} step(s) again')
  for a, r in rows:
    named = r.get('other_named') or {}
    if named:
      lines.append(f'{a["attempt"]:<10}of other, named by its first new '
                   'step: ' + ', '.join(
                       f'{k} {v:.2f}'
                       for k, v in sorted(named.items(), key=lambda kv: -kv[1])
                       if v >= 0.005))
  return '\n'.join(lines)


def other_said(attempt: records.AttemptRow) -> str:
  """Process 0's 'other' of an attempt, with what of it has a name, the
  biggest first, e.g. 'other 1.20 s: record_fetch 0.61, agreement 0.20,
  unnamed 0.39'."""
  other = attempt['parts'].get('other', 0.0)
  named = attempt.get('other_named') or {}
  pieces = [
      f'{k} {v:.2f}' for k, v in sorted(named.items(), key=lambda kv: -kv[1])
      if v >= 0.005
  ]
  pieces.append(f'unnamed {max(0.0, other - sum(named.values())):.2f}')
  return f'other {other:.2f} s: ' + ', '.join(pieces)


def interval_advice(record: layout.Record) -> str:
  """The local tier's interval this job's own history recommends
  (runtime/common/copy_interval.py): the last copy's blocking, the mean of
  its restores, its hard failures over its time; '' before any copy."""
  blocking, restores = None, []
  for attempt, ledgers in sorted(record.attempts_with_ledgers().items()):
    try:
      with open(ledgers.get(0, next(iter(ledgers.values())))) as f:
        notes = json.load(f).get('notes') or {}
    except (OSError, ValueError, StopIteration):
      continue
    if (notes.get('local_interval') or {}).get('blocking_s') is not None:
      blocking = notes['local_interval']['blocking_s']
    if notes.get('restore_s') is not None:
      restores.append(notes['restore_s'])
  if blocking is None:
    return ''
  failures, seconds = goodput.failures_in(record.ledgers())
  mtbf, source = ((seconds / failures,
                   f'{failures} hard failure(s) in {seconds:.0f} s')
                  if failures else (copy_interval.DEFAULT_MTBF_S,
                                    'no hard failure yet: the default'))
  restore = sum(restores) / len(restores) if restores else 0.0
  chosen = copy_interval.interval(blocking, restore, mtbf, source)
  return (f'local copies: every {chosen.seconds:.1f} s of training '
          f'recommended from this job\'s history, {chosen.why}')


def plot(result: records.RollUp, out: str) -> None:
  """A stacked bar of seconds per attempt, one colour per category."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  attempts = result['attempts']
  labels = [
      f'{a["attempt"]}\n(exit {a["exit_code"]})'
      if a['exit_code'] is not None else str(a['attempt']) for a in attempts
  ]
  fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(attempts) + 3), 5))
  bottom = [0.0] * len(attempts)
  tab20 = plt.get_cmap('tab20')
  colours = [tab20(i) for i in range(20)]
  for i, part in enumerate(PARTS):
    values = [a['parts'].get(part, 0.0) for a in attempts]
    if not any(values):
      continue
    colour = 'tab:green' if part == 'productive' else colours[i % 20]
    ax.bar(labels, values, bottom=bottom, label=part, color=colour)
    bottom = [b + v for b, v in zip(bottom, values)]
  ax.set_xlabel('attempt')
  ax.set_ylabel('seconds')
  ax.set_title(f'goodput {result["goodput"]:.3f} of {result["wall_s"]:.1f} s '
               f'wall time')
  ax.legend(loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8)
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument('workdir')
  parser.add_argument('--out',
                      default='',
                      help='PNG; default '
                      'WORKDIR/goodput.png')
  parser.add_argument('--attempts',
                      default='',
                      help="the launcher's "
                      'attempts.jsonl; default WORKDIR/logs/attempts.jsonl')
  args = parser.parse_args(argv)
  workdir = args.workdir
  if layout.in_bucket(workdir):
    if importlib.util.find_spec('gcsfs') is None:
      print(
          f'podrun-goodput: error: {workdir}: a bucket needs gcsfs, which is '
          "not installed: pip install -e '.[gcs]'",
          file=sys.stderr)
      return 2
    workdir = record_mirror.fetch_record(
        workdir, tempfile.mkdtemp(prefix='podrun-record-'))
  record = layout.Record(workdir)
  result = goodput_rollup.write_rollup(record, args.attempts or None)
  if not result['attempts']:
    print(f'no goodput ledgers under {args.workdir}/goodput', file=sys.stderr)
    return 2
  print(f'wall time {result["wall_s"]:.2f} s, goodput '
        f'{result["goodput"]:.3f} (productive steps / wall time), '
        f'{len(result["attempts"])} attempt(s); '
        f'{result["between_commands_s"]:.2f} s between commands, outside '
        'the wall time')
  print(capacity_line(result) + '\n')
  print(
      table([(f'attempt {a["attempt"]}', a['parts']) for a in result['attempts']
            ] + [('job', result['parts'])], 'seconds'))
  for a in result['attempts']:
    print(f'attempt {a["attempt"]}: {other_said(a)}')
  print('\nper process (each process\'s own ledger):')
  rows = []
  for a in result['attempts']:
    for process_index, parts in result['ranks'][a['name']].items():
      rows.append((f'a{a["attempt"]} rank {process_index}', parts))
  print(table(rows, 'seconds'))
  advice = interval_advice(record)
  if advice:
    print('\n' + advice)
  recoveries = recovery_table(result['attempts'])
  if recoveries:
    print('\ntime to recover (from the fault to the first productive step):')
    print(recoveries)
  out = args.out or os.path.join(workdir, 'goodput.png')
  plot(result, out)
  print(f'\nwrote {out}')
  return 0


def run() -> None:
  """The console script `podrun-goodput`."""
  sys.exit(main())


if __name__ == '__main__':
  run()
