"""Elastic slices against waiting for the lost one, on the emulated Cloud TPU.

2 spot slices x 2 workers x 2 emulated devices, the probe linear
regression (--steps; --device_example_seconds for each example of a
device's share of the batch, so that the job on one slice takes steps twice
as long, as devices that compute do); one slice is preempted when
process 0 logs step --preempt_at, and creating it again waits --capacity_s
for capacity. Side by side, for slice 1 lost and for slice 0 lost:

- elastic: --min_slices=1, a queued resource per slice: the job goes on
  on the other slice and grows back when the lost one is set up;
- waiting: one multislice queued resource, as without --min_slices: the
  job waits for the slice to be recreated.

With --notice=0 the lost slice's VMs are SIGKILLed at once, no notice.
With --bucket the workdir is in a bucket of fake-gcs-server on 127.0.0.1
(tests/gcs.py), as the docs have it for --create, and every VM reaches it;
--metadata=silent then points google.auth at a metadata address that never
answers (tests/gcs.py's SilentMetadata). --repo runs another checkout's
launcher and bundle (a worktree of an older commit: before and after) on
the same emulated service.

Every driver line is stamped as it arrives. Reports the seconds from
PREEMPTED (the service's event) to the survivors' relaunch, to their first
step and to the next create request, with what ended the driver's wait
for the lost slice's job; from READY (the driver's first sight of the
recreated slice ACTIVE) to the first step on every slice; both in phases
that the driver's lines mark (`preempted_phases`, `ready_phases`: the
detection, the wait, the set-up, the agreed save, ssh, the processes'
start-up, jax.distributed's init, the restore, the compile and first
step); the steps and the longest gap between steps while the slice was
away, the steps recomputed, the wall time, goodput and capacity-weighted
goodput, and how far the final parameters are from an undisturbed run's.

  python tests/benchmarks/benchmark_tpu_elastic.py [--steps=2000]
      [--preempt_at=100] [--capacity_s=60] [--device_example_seconds=0.01]
      [--poll_interval=1] [--modes=elastic,waiting] [--lost=1,0] [--notice=1,0]
      [--bucket] [--metadata=refused|silent] [--repo=DIR]
      [--out=FILE.json] [--lines_dir=DIR]
"""

import argparse
import contextlib
import itertools
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
sys.path.insert(0, REPO)

from launcher.common import goodput_rollup  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.common import layout  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.common import mappings  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import gcs as gcs_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import helpers  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests import tpu_emulation  # pylint: disable=g-import-not-at-top,wrong-import-position

NAME = 'elastic'
_STEP = re.compile(r'metrics\.py:\d+\] step (\d+)/')


def _job(args) -> list[str]:
  return [
      f'--config={helpers.PROBE_CONFIG}', '--local_devices=2',
      f'--config.steps={args.steps}', '--config.log_every=1',
      '--config.global_batch_size=40',
      f'--config.device_example_seconds={args.device_example_seconds}'
  ]


def _stamped(proc) -> list[tuple[float, str]]:
  """Every line of the driver's stdout and stderr, with its arrival."""
  lines, lock = [], threading.Lock()

  def read(pipe):
    for line in pipe:
      with lock:
        lines.append((time.time(), line.rstrip('\n')))

  threads = [
      threading.Thread(target=read, args=(p,), daemon=True)
      for p in (proc.stdout, proc.stderr)
  ]
  for t in threads:
    t.start()
  proc.wait(timeout=1800)
  for t in threads:
    t.join(timeout=10)
  return sorted(lines)


def run(args, mode: str, lost: int, notice: bool, tmp: pathlib.Path,
        bucket_env: dict) -> dict:
  """One launch; its figures. `bucket_env`: with --bucket, what points the
  driver and every VM at the bucket ({} without)."""
  preempt = ['', '']
  preempt[lost if mode == 'elastic' else 0] = f'step {args.preempt_at}/'
  waits = (f'0.5,0.5,{args.capacity_s}'
           if mode == 'elastic' else f'0.5,{args.capacity_s}')
  fleet = tpu_emulation.FakePod(tmp,
                                FAKE_QR_WAIT_S=waits,
                                FAKE_QR_PROVISION_S='0.5',
                                FAKE_QR_PREEMPT_ON_LOG=','.join(preempt),
                                FAKE_QR_LOG_NODE=f'{NAME}-0',
                                FAKE_TPU_PREEMPT_NOTICE='1' if notice else '0',
                                FAKE_TPU_WORKER_ENV=json.dumps(bucket_env),
                                PYTHONPATH=args.repo,
                                **bucket_env)
  workdir = (f'gs://runs/{tmp.name}' if bucket_env else str(tmp / 'work'))
  elastic = ['--min_slices=1'] if mode == 'elastic' else []
  started = time.time()
  proc = fleet.start('--create',
                     '--accelerator_type=v4-16',
                     '--spot',
                     '--runtime_version=tpu-ubuntu2204-base',
                     '--num_slices=2',
                     f'--poll_interval={args.poll_interval}',
                     '--max_restarts=3',
                     '--delete_after',
                     *elastic,
                     '--',
                     *_job(args),
                     f'--workdir={workdir}',
                     tpu=NAME,
                     cwd=args.repo)
  try:
    lines = _stamped(proc)
  finally:
    _stop(proc)
  if proc.returncode:
    raise SystemExit(f'{mode}: exit {proc.returncode}\n' +
                     '\n'.join(l for _, l in lines[-40:]))
  if args.lines_dir:
    with open(os.path.join(args.lines_dir, f'{mode}-{lost}-{int(notice)}.log'),
              'w') as f:
      f.writelines(f'{t:.3f} {l}\n' for t, l in lines)
  record = tmp / 'work'
  if bucket_env:
    record = _fetch_record(workdir, tmp / 'record', bucket_env)
  return {
      'mode': mode,
      'lost': lost,
      'notice': notice,
      'wall_s': time.time() - started,
      **_timeline(lines, fleet.events()),
      **_rollup(record, fleet.logs / 'attempts.jsonl')
  }


def _fetch_record(url: str, into: pathlib.Path, env: dict) -> pathlib.Path:
  subprocess.run([
      sys.executable, '-c', 'import sys; from launcher.common import '
      'record_mirror; record_mirror.fetch_record(sys.argv[1], sys.argv[2])',
      url,
      str(into)
  ],
                 cwd=REPO,
                 env=helpers.launcher_env(**env),
                 check=True,
                 timeout=300)
  return into


def _stop(proc) -> None:
  """A driver still running (this script was stopped) gets SIGTERM, which
  deletes what it created, then its group SIGKILL."""
  if proc.poll() is None:
    proc.terminate()
    try:
      proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
      pass
  helpers.kill_group(proc)


# What the driver's lines mark after a relaunch, in order: (phase, the
# line that ends it). A phase is the time from the mark before.
_AFTER_RELAUNCH = (('ssh', '[worker 0] podrun: starting job'),
                   ('startup', 'jax.distributed.initialize('),
                   ('distributed_init', '] topology: process 0'),
                   ('restore', 'restored '), ('compile_and_step', _STEP))
# PREEMPTED (the service's event) to the survivors' relaunch.
_TO_RELAUNCH = (('detection', 'the slice is lost under job'),
                ('lost_slice_wait', 'lost: starting again at once on'))
# READY (the driver's first sight of the recreated slice ACTIVE) to the
# relaunch on every slice.
_TO_GROW = (('set_up', ' is back after '), ('agreed_save',
                                            ' back: starting again at once on'))


def _phases(lines, since: float, marks) -> tuple[dict, float]:
  """{phase: seconds} between the first lines after `since` that match
  each mark in turn; None from a mark no line matched. Returns the phases
  and the time of the last mark found."""
  out, at = {}, since
  for phase, needle in marks:
    found = next(
        (t for t, l in lines if t >= at and
         (needle.search(l) if hasattr(needle, 'search') else needle in l)),
        None)
    out[phase] = None if found is None else round(found - at, 2)
    at = found if found is not None else at
  return out, at


def _timeline(lines, events) -> dict:
  """Seconds between the service's PREEMPTED, the driver's lines and the
  job's steps (its lines as they reached the driver)."""
  preempted = next(e['t'] for e in events if e['event'] == 'preempted')
  steps = [t for t, l in lines if _STEP.search(l)]

  def at(needle: str, after: float = 0.0):
    return next((t for t, l in lines if t >= after and needle in l), None)

  def first_step_after(when):
    return next(t for t in steps if t > when)

  # Elastic: the shrink; waiting: the recreated slice's relaunch.
  relaunch = at('lost: starting again at once on') or at('s): relaunching')
  created = [
      e['t'] for e in events if e['event'] == 'created' and e['t'] > preempted
  ]
  to_relaunch, _ = _phases(lines, preempted, _TO_RELAUNCH)
  after, _ = _phases(lines, relaunch, _AFTER_RELAUNCH)
  out = {
      'first_step_after_preempted_s':
          first_step_after(relaunch) - preempted,
      'preempted_to_relaunch_s':
          relaunch - preempted,
      'preempted_to_create_request_s':
          created[0] - preempted if created else None,
      'what_ended_the_wait':
          next((l.split('launch_tpu_pod: ', 1)[-1]
                for t, l in lines
                if t >= preempted and l.endswith(': going on')), None),
      'preempted_phases': {
          **to_relaunch,
          **after
      }
  }
  back = at(' is back after ')
  grew = at(' back: starting again at once on')
  if grew is not None:
    away = [t for t in steps if relaunch < t < back]
    ready = at('queued resource ACTIVE', after=relaunch)
    to_grow, _ = _phases(lines, ready, _TO_GROW)
    after, _ = _phases(lines, grew, _AFTER_RELAUNCH)
    out.update(steps_while_away=len(away),
               longest_gap_away_s=float(max(np.diff(away), default=0.0)),
               ready_to_first_step_on_both_s=first_step_after(grew) - ready,
               ready_phases={
                   **to_grow,
                   **after
               })
  return out


def _rollup(workdir: pathlib.Path, attempts: pathlib.Path) -> dict:
  """Goodput with the driver's attempts, so its waits count."""
  roll = goodput_rollup.rollup(layout.Record(str(workdir)), str(attempts))
  return {
      'goodput':
          roll['goodput'],
      'capacity_goodput':
          roll['capacity_goodput'],
      'recomputed_steps':
          sum(a['notes'].get('recomputed_steps') or 0 for a in roll['attempts']
             ),
      'attempts':
          len(roll['attempts'])
  }


def straight(args, tmp: pathlib.Path) -> dict:
  result = helpers.run_launcher(
      [*_job(args), '--local_devices=8', f'--workdir={tmp}'], timeout=1800)
  assert result.returncode == 0, result.output
  return helpers.final_state(tmp)['params']


def max_relative(one, two) -> float:
  """The largest relative difference between matching leaves of two trees."""
  two = mappings.flatten(two)
  return max(
      float(
          np.max(
              np.abs(np.asarray(a) - np.asarray(two[name])) /
              np.maximum(np.abs(np.asarray(two[name])), 1e-12)))
      for name, a in mappings.flatten(one).items())


def main(argv=None) -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument('--steps', type=int, default=2000)
  parser.add_argument('--preempt_at', type=int, default=100)
  parser.add_argument('--capacity_s', type=float, default=60)
  # 5 examples per device at full size (40 on 8 devices): 0.05 s steps,
  # 0.1 s on half the devices.
  parser.add_argument('--device_example_seconds', type=float, default=0.01)
  parser.add_argument('--poll_interval', type=float, default=1)
  parser.add_argument('--modes', default='elastic,waiting')
  parser.add_argument('--lost',
                      default='1,0',
                      help='which slices to lose, one launch per mode each')
  parser.add_argument('--notice',
                      default='1',
                      help='1: the VMs get SIGTERM first (a preemption '
                      'notice); 0: SIGKILL at once; 1,0: both')
  parser.add_argument('--out', default='')
  parser.add_argument('--lines_dir',
                      default='',
                      help='writes each driver\'s stamped lines there')
  parser.add_argument('--bucket',
                      action='store_true',
                      help='the workdir in a bucket of fake-gcs-server')
  parser.add_argument('--metadata',
                      default='refused',
                      choices=('refused', 'silent'))
  parser.add_argument('--repo',
                      default=REPO,
                      help='the checkout whose launcher and bundle run')
  args = parser.parse_args(argv)
  args.repo = os.path.abspath(args.repo)
  tpu_emulation.SCRIPT = os.path.join(args.repo, 'scripts', 'launch_tpu_pod.sh')
  # SIGTERM unwinds, so that every driver started is stopped.
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
  results = []
  # A recreated VM's worker may still be writing as the run ends.
  with tempfile.TemporaryDirectory(prefix='tpu-elastic-',
                                   ignore_cleanup_errors=True) as tmp, \
       contextlib.ExitStack() as stack:
    bucket_env = {}
    if args.bucket:
      gcs = stack.enter_context(gcs_lib.FakeGcs(pathlib.Path(tmp)))
      gcs.bucket('runs')
      bucket_env = gcs.env()
      if args.metadata == 'silent':
        bucket_env.update(stack.enter_context(gcs_lib.SilentMetadata()).env())
    reference = (None if args.bucket else straight(
        args,
        pathlib.Path(tmp) / 'straight'))
    for lost, notice, mode in itertools.product(
        [int(l) for l in args.lost.split(',')],
        [n == '1' for n in args.notice.split(',')], args.modes.split(',')):
      here = pathlib.Path(tmp) / f'{mode}-{lost}-{int(notice)}'
      figures = run(args, mode, lost, notice, here, bucket_env)
      # With --bucket the checkpoints stay in the bucket (the tests hold
      # the bucket's resumes to the bit).
      figures['max_relative_error'] = None if args.bucket else max_relative(
          helpers.final_state(here / 'work')['params'], reference)
      results.append(figures)
      print(json.dumps(figures), flush=True)
  if args.out:
    with open(args.out, 'w') as f:
      json.dump({'args': vars(args), 'runs': results}, f, indent=2)
  return 0


if __name__ == '__main__':
  sys.exit(main())
