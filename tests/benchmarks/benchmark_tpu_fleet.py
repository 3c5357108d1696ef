"""Measures the TPU pod driver against the emulated Cloud TPU of the tests.

- scale: 2 and 64 workers (a v4-16 and a v4-512) with the shell stand-in
  job of tests/fake_gcloud/standin_job, side by side: launch to every
  worker started, `--status`, and one worker's failure to every process
  of every worker gone;
- babysit: three scripted spot preemptions of a --create launch (a probe
  job that sleeps 0.1 s a step, 48 steps), with --poll_interval 1 and 3:
  from each preemption to the request that creates the slice again, and
  the infrastructure recovery (delete, create, wait, set-up) against the
  whole job.

  python tests/benchmarks/benchmark_tpu_fleet.py [--sections=scale,babysit]
      [--out=FILE.json]
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
sys.path.insert(0, REPO)

from tests import helpers  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import tpu_emulation  # pylint: disable=g-import-not-at-top,wrong-import-position


def _all_started(pod, workers: int) -> bool:
  try:
    return all('step 1\n' in pod.log(w) for w in range(workers))
  except FileNotFoundError:
    return False


def scale(workers: int, tmp: str) -> dict:
  """Start-up, --status and teardown times of one stand-in job."""
  os.makedirs(tmp)
  pod = tpu_emulation.FakePod(pathlib.Path(tmp), workers=workers)
  fail_file = os.path.join(tmp, 'fail_now')
  launched = time.monotonic()
  proc = pod.start('--',
                   '--standin.fail_process=1',
                   f'--standin.fail_when={fail_file}',
                   python=str(tpu_emulation.FAKE_BIN / 'standin_job'))
  try:
    if not helpers.wait_for(lambda: _all_started(pod, workers), 300):
      raise RuntimeError(f'{workers} workers never all started')
    started = time.monotonic() - launched
    asked = time.monotonic()
    status = pod.run('--status', job_id='', timeout=300)
    status_s = time.monotonic() - asked
    open(fail_file, 'w').close()
    failed = time.monotonic()
    result = helpers.finish(proc, 300, launched)
    helpers.wait_for(lambda: not pod.processes(), 120)
    stopped = time.monotonic() - failed
  finally:
    helpers.kill_group(proc)
    pod.kill_leftovers()
  return {
      'workers': workers,
      'exit_code': result.returncode,
      'status_exit_code': status.returncode,
      'all_started_s': started,
      'status_s': status_s,
      'failure_to_all_stopped_s': stopped
  }


def babysit(poll_s: float, tmp: str) -> dict:
  """Three preemptions of a --create launch; gaps and recovery times."""
  os.makedirs(tmp)
  root = pathlib.Path(tmp)
  pod = tpu_emulation.FakePod(root,
                              FAKE_QR_WAIT_S='0.5',
                              FAKE_QR_PROVISION_S='0.5',
                              FAKE_QR_PREEMPT_ON_LOG='step 12/,step 24/,'
                              'step 36/')
  args = [
      '--create', '--accelerator_type=v4-16',
      '--runtime_version=tpu-ubuntu2204-base', '--spot', '--max_restarts=3',
      '--delete_after', f'--poll_interval={poll_s:g}', '--',
      f'--config={helpers.PROBE_CONFIG}', '--local_devices=4',
      '--config.steps=48', '--config.log_every=1',
      '--config.checkpoint_every=5', '--config.fail_mode=slow',
      '--config.fail_rank=0', '--config.fail_step=0',
      '--config.fail_seconds=0.1', f'--workdir={root / "work"}'
  ]
  started = time.monotonic()
  result = pod.run(*args, tpu='bench-run', timeout=400)
  wall = time.monotonic() - started
  pod.kill_leftovers()
  events = pod.events()
  preempted = [e['t'] for e in events if e['event'] == 'preempted']
  created = [e['t'] for e in events if e['event'] == 'created']
  attempts = helpers.read_jsonl(pod.logs / 'attempts.jsonl')
  infra = [
      a['infrastructure']['seconds']
      for a in attempts
      if a.get('infrastructure')
  ]
  return {
      'poll_interval_s': poll_s,
      'exit_code': result.returncode,
      'job_wall_s': wall,
      'preempted_to_recreate_request_s': [
          c - p for p, c in zip(preempted, created[1:])
      ],
      'infrastructure_recovery_s': infra,
      'queued_resources_left': len(pod.queued_resources())
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument('--sections', default='scale,babysit')
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  sections = args.sections.split(',')
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    if 'scale' in sections:
      out['scale'] = [scale(w, os.path.join(tmp, f'scale{w}')) for w in (2, 64)]
      small, big = out['scale']
      out['scale_ratio_64_to_2'] = {
          k: big[k] / small[k]
          for k in ('all_started_s', 'status_s', 'failure_to_all_stopped_s')
      }
    if 'babysit' in sections:
      out['babysit'] = [
          babysit(p, os.path.join(tmp, f'babysit{p:g}')) for p in (1.0, 3.0)
      ]
  text = json.dumps(out, indent=1)
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
