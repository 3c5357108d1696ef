"""A workdir on local disk against one in a bucket: what the mirror costs.

The same 2x4 local pod of configs/mlp.py, side by side in one run, with its
workdir in a local temporary directory and in a bucket of fake-gcs-server
on 127.0.0.1 (tests/gcs.py; the test extra installs it), and in the same
bucket behind a proxy that delays every request by --latency_ms. The
bucket's workdir has its checkpoints there too, and its record mirrored
(launcher/common/record_mirror.py) with uploads every --upload_every_s
seconds instead of the default 10, to make their cost visible. Each round
times, from process 0's metrics.jsonl and the launcher:

- steps_per_sec: the median of the logged step windows after the first;
- launcher_s: the launcher's whole run, start-up, fetch, last upload and
  goodput roll-up included.

  python tests/benchmarks/benchmark_record.py [--rounds=3] [--steps=2000]
      [--latency_ms=50] [--upload_every_s=1] [--out=FILE.json]
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts import side_by_side  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import gcs as gcs_lib  # pylint: disable=g-import-not-at-top,wrong-import-position


def _run(workdir: str, record_dir: pathlib.Path, steps: int, env: dict) -> dict:
  """One launch; its figures."""
  started = time.perf_counter()
  subprocess.run([
      sys.executable, '-m', 'launcher', '--config=configs/mlp.py',
      f'--config.steps={steps}', '--config.log_every=50',
      '--config.checkpoint_every=500', '--local_processes=2',
      '--local_devices=4', f'--workdir={workdir}'
  ],
                 cwd=REPO,
                 env={
                     **os.environ,
                     **env
                 },
                 capture_output=True,
                 text=True,
                 check=True,
                 timeout=1200)
  elapsed = time.perf_counter() - started
  with open(record_dir / 'metrics.jsonl') as f:
    rates = [
        r['steps_per_sec'] for r in map(json.loads, f) if 'steps_per_sec' in r
    ]
  return {'steps_per_sec': statistics.median(rates[1:]), 'launcher_s': elapsed}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=2000)
  parser.add_argument('--latency_ms', type=float, default=50)
  parser.add_argument('--upload_every_s', type=float, default=1)
  parser.add_argument('--out', default='')
  args = parser.parse_args()
  rounds = {'local': [], 'bucket': [], 'slow_bucket': []}
  with tempfile.TemporaryDirectory() as tmp:
    server = gcs_lib.FakeGcs(pathlib.Path(tmp)).start()
    cache = pathlib.Path(tmp) / 'record'
    upload = {
        'PODRUN_RECORD_UPLOAD_EVERY_S': str(args.upload_every_s),
        'PODRUN_RECORD_CACHE': str(cache)
    }
    try:
      server.bucket('bench')
      with gcs_lib.SlowProxy(server.url, args.latency_ms / 1000) as slow:
        for i in range(args.rounds):  # Alternated: the noise is shared.
          local = pathlib.Path(tmp) / f'local_{i}'
          rounds['local'].append(_run(str(local), local, args.steps, {}))
          rounds['bucket'].append(
              _run(f'gs://bench/fast_{i}', cache / 'bench' / f'fast_{i}',
                   args.steps, {
                       **server.env(),
                       **upload
                   }))
          rounds['slow_bucket'].append(
              _run(f'gs://bench/slow_{i}', cache / 'bench' / f'slow_{i}',
                   args.steps, {
                       **server.env(),
                       **slow.env(),
                       **upload
                   }))
    finally:
      server.stop()
  results = {
      'steps': args.steps,
      'latency_ms': args.latency_ms,
      'upload_every_s': args.upload_every_s
  }
  side_by_side.report(results, rounds, args.out)


if __name__ == '__main__':
  main()
