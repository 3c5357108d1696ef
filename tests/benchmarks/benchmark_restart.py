"""A restart from a bucket against one from a disk, in the job's own ledger.

The probe on a local pod of 2 processes x 4 emulated devices (20 steps, a
checkpoint every 10), process 1 SIGKILLed at step 15 and the job restarted
once; the workdir in a bucket of fake-gcs-server on 127.0.0.1 and on local
disk, side by side, each run with every checkout of --repos (a worktree of
an older commit: before and after in one run). For each attempt, process
0's ledger: process start to its first step, its parts (start-up,
jax.distributed's init, the restore, the compile, other) and what of
`other` has no name.

--metadata says what the Google auth libraries find at the metadata
address: `refused` (tests/gcs.py's FakeGcs.env(), as the tests run) or
`silent` (tests/gcs.py's SilentMetadata: connections accepted, never
answered, as behind a firewall that drops them).

  python tests/benchmarks/benchmark_restart.py [--repos=.,/tmp/before]
      [--metadata=silent] [--out=FILE.json]
"""

import argparse
import glob
import json
import os
import pathlib
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests import gcs as gcs_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import helpers  # pylint: disable=g-import-not-at-top,wrong-import-position

JOB = [
    f'--config={helpers.PROBE_CONFIG}', '--config.steps=20',
    '--config.checkpoint_every=10', '--config.fail_rank=1',
    '--config.fail_step=15', '--config.fail_mode=sigkill',
    '--config.fail_once=True', '--max_restarts=1', '--retry_exit_codes=137',
    '--restart_backoff=0.5', '--local_processes=2', '--local_devices=4'
]


def _attempts(record: pathlib.Path) -> list[dict]:
  """Process 0's ledger of each attempt, in order: its figures."""
  rows = []
  for path in glob.glob(str(record / 'goodput' / '*' / 'rank_0.json')):
    ledger = json.loads(pathlib.Path(path).read_text())
    parts = ledger['parts']
    named = ledger.get('other_named') or {}
    first = ledger['notes'].get('first_step_wall')
    rows.append({
        'started': ledger['started'],
        'to_first_step_s': None if first is None else first - ledger['started'],
        **{
            k: parts[k] for k in ('startup', 'distributed_init', 'checkpoint_restore', 'compile', 'other')
        }, 'other_unnamed': parts['other'] - sum(named.values())
    })
  return sorted(rows, key=lambda r: r['started'])


def run(repo: str, workdir: str, env: dict, gcs) -> list[dict]:
  """One job from `repo`; its attempts' figures."""
  proc = helpers.start_launcher([*JOB, f'--workdir={workdir}'],
                                cwd=repo,
                                env=helpers.launcher_env(**env))
  try:
    result = helpers.finish(proc, 600, time.monotonic())
  finally:
    helpers.kill_group(proc)
  if result.returncode:
    raise SystemExit(f'{repo} {workdir}: exit {result.returncode}\n'
                     f'{result.output[-3000:]}')
  record = pathlib.Path(workdir)
  if workdir.startswith('gs://'):
    record = gcs.fetch_record(workdir, pathlib.Path(env['TMP_RECORD']))
  return _attempts(record)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument('--repos',
                      default=str(REPO),
                      help='checkouts to run, comma-separated')
  parser.add_argument('--metadata',
                      default='silent',
                      choices=('refused', 'silent'))
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  results = []
  with tempfile.TemporaryDirectory(prefix='restart-') as tmp, \
       gcs_lib.FakeGcs(pathlib.Path(tmp)) as gcs, \
       gcs_lib.SilentMetadata() as silent:
    gcs.bucket('runs')
    env = gcs.env()
    if args.metadata == 'silent':
      env.update(silent.env())
    for i, repo in enumerate(args.repos.split(',')):
      repo = os.path.abspath(repo)
      for where in ('bucket', 'disk'):
        workdir = (f'gs://runs/{i}-{where}'
                   if where == 'bucket' else f'{tmp}/{i}-{where}')
        here = {
            **env, 'PODRUN_RECORD_CACHE': f'{tmp}/cache-{i}',
            'PYTHONPATH': repo,
            'TMP_RECORD': f'{tmp}/record-{i}'
        }
        before = silent.connections
        rows = run(repo, workdir, here, gcs)
        asked = silent.connections - before
        results.append({
            'repo': repo,
            'where': where,
            'attempts': rows,
            'metadata_connections': asked
        })
        print(
            f'{repo} {where}: {asked} connection(s) to the metadata '
            'address',
            flush=True)
        for n, row in enumerate(rows, 1):
          print(f'{repo} {where} attempt {n}: ' +
                ' '.join(f'{k}={v:.2f}' for k, v in row.items()
                         if k != 'started' and v is not None),
                flush=True)
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(results, indent=1))
  return 0


if __name__ == '__main__':
  sys.exit(main())
