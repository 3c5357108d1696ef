"""launcher/tpu/queued.py and flags.py without gcloud: requests, phases,
the wait's per-phase clock, and the flags that go with --create."""

import dataclasses
import os
import subprocess
import time
import typing

import pytest

from launcher import attempts
from launcher import elastic as policy
from launcher.tpu import commands
from launcher.tpu import elastic
from launcher.tpu import flags
from launcher.tpu import queued
from runtime.common import exit_codes
from runtime.common import files
from tests import helpers

pytestmark = pytest.mark.unit


def test_a_request_becomes_the_sdks_create_arguments():
  one = queued.Request('run7', ('run7',),
                       'v4-32',
                       'img',
                       tier='spot',
                       valid_until='6h')
  assert one.create_args() == [
      'run7', '--accelerator-type=v4-32', '--runtime-version=img',
      '--node-id=run7', '--spot', '--valid-until-duration=6h'
  ]
  two = queued.Request('run7',
                       queued.node_names('run7', 2),
                       'v5p-128',
                       'img',
                       tier='reserved',
                       valid_until='2026-12-02T00:00:00Z')
  assert two.nodes == ('run7-0', 'run7-1')
  assert two.create_args()[3:] == [
      '--node-count=2', '--node-prefix=run7', '--reserved',
      '--valid-until-time=2026-12-02T00:00:00Z'
  ]
  assert '--spot' not in queued.Request('r', ('r',), 'v4-8',
                                        'img').create_args()


@pytest.mark.parametrize('qr,nodes,phase', [
    ('ACCEPTED', {}, 'capacity'),
    ('WAITING_FOR_RESOURCES', {}, 'capacity'),
    ('PROVISIONING', {
        'n': ('CREATING', '')
    }, 'provisioning'),
    ('ACTIVE', {
        'n': ('CREATING', '')
    }, 'ready'),
    ('ACTIVE', {
        'n': ('READY', 'TIMEOUT')
    }, 'ready'),
    ('ACTIVE', {
        'n': ('READY', 'HEALTHY'),
        'm': ('READY', '')
    }, 'up'),
    ('ACTIVE', {
        'n': ('READY', 'HEALTHY'),
        'm': ('PREEMPTED', '')
    }, 'lost'),
    ('SUSPENDING', {
        'n': ('PREEMPTED', '')
    }, 'lost'),
    ('SUSPENDED', {}, 'lost'),
    ('FAILED', {}, 'lost'),
    (queued.NOT_FOUND, {}, 'lost'),
])
def test_phases(qr, nodes, phase):
  assert queued.Observation(qr, nodes).phase() == phase


def _fleet(monkeypatch, script, timeouts=(60, 60, 60)):
  """A Fleet whose observe() returns `script` one by one (an exception
  instance is raised)."""
  seen = iter(script)

  def observe(gcloud, request):
    del gcloud, request
    item = next(seen)
    if isinstance(item, Exception):
      raise item
    return item

  monkeypatch.setattr(queued, 'observe', observe)
  said = []
  fleet = queued.Fleet(commands.Gcloud('run7', 'z'),
                       queued.Request('run7', ('run7',), 'v4-8', 'img'),
                       queued.Timeouts(*timeouts), 0.01, '/dev/null',
                       said.append, lambda: False)
  return fleet, said


WAITING = queued.Observation('WAITING_FOR_RESOURCES', {})
UP = queued.Observation('ACTIVE', {'run7': ('READY', 'HEALTHY')})


def test_the_wait_follows_the_phases_and_ends_up(monkeypatch):
  fleet, said = _fleet(
      monkeypatch,
      [WAITING, WAITING,
       queued.Observation('PROVISIONING', {}), UP])
  assert fleet.wait_up() == UP and fleet.up
  assert said == [
      'run7: queued resource WAITING_FOR_RESOURCES',
      'run7: queued resource PROVISIONING',
      'run7: queued resource ACTIVE; node(s) run7 READY/HEALTHY'
  ]


def test_a_phase_past_its_timeout_is_named(monkeypatch):
  fleet, _ = _fleet(monkeypatch, [WAITING] * 1000, timeouts=(0.05, 60, 60))
  with pytest.raises(commands.LaunchError) as e:
    fleet.wait_up()
  assert e.value.exit_code == exit_codes.POD_UNAVAILABLE
  assert ('the capacity phase took over 0.05 s (--capacity_timeout)'
          in str(e.value))


def test_a_failed_read_is_retried_a_few_times_only(monkeypatch):
  error = commands.LaunchError('describe failed',
                               exit_code=exit_codes.POD_UNAVAILABLE)
  fleet, said = _fleet(monkeypatch, [error, error, UP])
  assert fleet.wait_up() == UP
  assert said[0] == 'could not read queued resource run7: describe failed'
  fleet, _ = _fleet(monkeypatch, [error] * 5)
  with pytest.raises(commands.LaunchError, match='describe failed'):
    fleet.wait_up()


def test_a_lost_slice_is_not_up(monkeypatch):
  fleet, _ = _fleet(monkeypatch, [UP, queued.Observation('SUSPENDED', {})])
  fleet.wait_up()
  assert fleet.lost() is not None and not fleet.up


@pytest.mark.parametrize('argv,message', [
    (['--spot', '--reserved', '--create'], '--spot and --reserved'),
    (['--create'], '--create needs --accelerator_type and --runtime_version'),
    (['--delete_after'], '--delete_after go(es) with --create'),
    (['--num_slices=0'], '--num_slices=0: at least 1'),
    ([
        '--create', '--accelerator_type=v4-8', '--runtime_version=i',
        '--poll_interval=0'
    ], '--poll_interval must be positive'),
    (['--num_slices=2', '--min_slices=1'], '--min_slices needs --create'),
    ([
        '--create', '--accelerator_type=v4-8', '--runtime_version=i',
        '--num_slices=2', '--min_slices=2'
    ], '--min_slices=2 with --num_slices=2: it must be from 1 to 1'),
    ([
        '--create', '--accelerator_type=v4-8', '--runtime_version=i',
        '--num_slices=2', '--min_slices=1', '--',
        '--config.topology.num_slices=2'
    ], '--config.topology.num_slices=2 fixes what --min_slices lets change'),
    ([
        '--create', '--accelerator_type=v4-8', '--runtime_version=i',
        '--num_slices=2', '--min_slices=1', '--min_replicas=1'
    ], '--min_slices and --min_replicas count the same slices here'),
])
def test_flags_that_do_not_go_together(argv, message, capsys):
  argv, _, extra = ' '.join(argv).partition(' -- ')
  with pytest.raises(SystemExit):
    flags.parse(['--tpu=t', '--zone=z', *argv.split()],
                ['--config=c.py', *extra.split()])
  assert message in capsys.readouterr().err


def test_an_elastic_launch_has_a_queued_resource_per_slice():
  base = queued.Request('run', ('tpu-0', 'tpu-1'),
                        'v4-16',
                        'image',
                        tier='spot')
  requests = elastic.requests(base)
  assert [(r.name, r.nodes) for r in requests] == [('run-0', ('tpu-0',)),
                                                   ('run-1', ('tpu-1',))]
  assert requests[1].create_args() == [
      'run-1', '--accelerator-type=v4-16', '--runtime-version=image',
      '--node-id=tpu-1', '--spot'
  ]


def test_min_replicas_counts_slices_and_tells_the_processes():
  """--min_replicas=K is --min_slices=K: a replica a slice."""
  options, _ = flags.parse([
      '--tpu=t', '--zone=z', '--create', '--accelerator_type=v4-8',
      '--runtime_version=i', '--num_slices=3', '--min_replicas=2'
  ], ['--config=c'])
  assert (options.min_slices, options.min_replicas) == (2, 2)


def test_the_tier_and_the_queued_resource_name():
  options, launcher_args = flags.parse([
      '--tpu=t', '--zone=z', '--create', '--accelerator_type=v4-8',
      '--runtime_version=i', '--reserved', '--workdir=w'
  ], ['--config=c'])
  assert (options.tier, options.queued_resource) == ('reserved', 't')
  assert list(launcher_args) == ['--config=c', '--workdir=w']


def test_the_flags_are_one_typed_frozen_options():
  """Every flag is a field of flags.PodFlags of the type its value has;
  nothing changes them after parse."""
  options, _ = flags.parse([
      '--tpu=t', '--zone=z', '--env=A=1', '--env=B=2', '--stop_grace=5',
      '--min_slices=1', '--num_slices=2', '--create', '--accelerator_type=v4-8',
      '--runtime_version=i'
  ], ['--config=c'])
  given = {a.dest for a in flags._parser()._actions if a.dest != 'help'}
  fields = {f.name: f.type for f in dataclasses.fields(flags.PodFlags)}
  read_together = {'max_restarts', 'restart_backoff', 'retry_exit_codes'}
  assert given - read_together | {'tier', 'restarts'} == set(fields)
  assert options.env == ('A=1', 'B=2') and options.stop_grace == 5.0
  for name, kind in fields.items():
    value = getattr(options, name)
    assert value is None or isinstance(
        value,
        typing.get_origin(kind) or
        (float if kind is float else kind)) or (kind is float and
                                                isinstance(value, int)), name
  with pytest.raises(dataclasses.FrozenInstanceError):
    options.stop_grace = 1


class _FakeFleet:
  """A slice's queued resource: up, or lost; recreated when asked."""

  def __init__(self, request):
    self.request, self.up, self.ours = request, True, True
    self.created = 0

  def lost(self):
    return None if self.up else queued.Observation('SUSPENDED', {})

  def delete(self, why):
    del why
    self.ours = False

  def create(self):
    self.created += 1
    self.ours = True

  def wait_up(self):
    self.up = True


class _Launch:
  workers = 1

  def __init__(self, log_dir='/nonexistent', backoff=0.05, timeout=5.0):
    self.options = type(
        'Options', (), {
            'queued_resource': 'run',
            'tpu': 'run',
            'slice_back_backoff': backoff,
            'slice_back_timeout': timeout
        })()
    self.gcloud, self.said, self.prepared = None, [], []
    self.log_dir = log_dir

  def path(self, name):
    return os.path.join(self.log_dir, name)

  def say(self, line):
    self.said.append(line)

  def interrupted(self):
    return False

  def prepare(self, nodes):
    self.prepared.append(nodes)


def _ended(code, lost=(), regrew=False) -> attempts.AttemptEnd:
  """How an attempt ended, as the elastic policy reads it (a TPU attempt
  has progressed once a slice is lost under it)."""
  return attempts.AttemptEnd(code, lost=lost, regrew=regrew, progressed=True)


def _after(group, end):
  """The one elastic policy's resize, over `group`."""
  return policy.Policy(group, group.launch.say).after(end)


def _group(minimum: int, **launch_options):
  """Two slices, run-a and run-b, behind fake queued resources."""
  launch = _Launch(**launch_options)
  base = queued.Request('run', ('run-a', 'run-b'), 'v4-16', 'image')
  group = elastic.SliceGroup(launch,
                             base,
                             queued.Timeouts(1, 1, 1),
                             0.1,
                             '/dev/null',
                             minimum=minimum)
  group.fleets = [_FakeFleet(r) for r in elastic.requests(base)]
  return launch, group


def test_a_lost_slice_shrinks_the_job_and_comes_back_to_grow_it():
  launch, group = _group(minimum=1)
  group.fleets[0].up = False  # Slice 0 (process 0, the coordinator) lost.
  assert group.lost() is not None
  assert _after(group, _ended(75, lost=(0,))) == policy.Resize('shrink')
  assert group.nodes() == ('run-b',)
  assert helpers.wait_for(lambda: group.grow_due(time.monotonic()), 10)
  assert launch.prepared == [('run-a',)] and group.fleets[0].created == 1
  assert group.describe() == ('run-b; run-a back, joining at the '
                              'next step boundary')
  assert _after(group, _ended(75, regrew=True)) == policy.Resize('grow')
  assert group.nodes() == ('run-a',
                           'run-b') and not group.grow_due(time.monotonic())
  assert _after(group, _ended(1)) is None  # A plain failure.


def test_below_min_slices_the_next_attempt_waits_for_them():
  _, group = _group(minimum=2)
  group.fleets[1].up = False
  assert _after(group, _ended(75, lost=(1,))) == policy.Resize('wait')
  assert group.ready(time.monotonic())
  assert group.nodes() == ('run-a', 'run-b')


def test_a_slice_that_does_not_come_back_is_retried_then_given_up():
  launch, group = _group(minimum=2, backoff=0.05, timeout=0.5)
  tries = []

  def never_up():
    tries.append(time.monotonic())
    raise commands.LaunchError('the capacity phase took over 1 s')

  group.fleets[1].wait_up = never_up
  group.fleets[1].up = False
  assert _after(group, _ended(75, lost=(1,))) == policy.Resize('wait')
  assert not group.ready(time.monotonic())
  assert len(tries) >= 3, tries
  gaps = [b - a for a, b in zip(tries, tries[1:])]
  assert all(g >= 0.05 for g in gaps) and gaps[-1] >= 2 * 0.05, gaps
  assert any('slice run-b did not come back (try 1): the capacity phase '
             'took over 1 s; trying again in 0.05 s' in line
             for line in launch.said), launch.said
  assert any(f'slice run-b did not come back in {len(tries)} tries '
             '(--slice_back_timeout=0.5 s)' in line
             for line in launch.said), launch.said
  assert group.describe() == 'run-a'


def test_a_slice_back_on_its_second_try_grows_the_job(tmp_path):
  launch, group = _group(minimum=1, log_dir=str(tmp_path), backoff=0.2)
  failures = ['the service answered FAILED']
  real_wait_up = group.fleets[1].wait_up

  def up_on_the_second_try():
    if failures:
      raise commands.LaunchError(failures.pop())
    real_wait_up()

  group.fleets[1].wait_up = up_on_the_second_try
  group.fleets[1].up = False
  assert _after(group, _ended(75, lost=(1,))) == policy.Resize('shrink')
  # --status, from another process of this machine, while the driver
  # waits to try again.
  assert helpers.wait_for(
      lambda: 'retrying' in ' '.join(
          elastic.status_lines([str(tmp_path)], 'run')), 5, 0.01)
  line, = elastic.status_lines([str(tmp_path)], 'run')
  assert line.startswith(f'slice run-b (driver pid {os.getpid()}): retrying '
                         'in '), line
  assert line.endswith('s: try 1 failed: the service answered FAILED'), line
  assert elastic.status_lines([str(tmp_path)], 'another-tpu') == []
  assert helpers.wait_for(lambda: group.grow_due(time.monotonic()), 10)
  assert group.fleets[1].created == 2 and launch.prepared == [('run-b',)]
  assert elastic.status_lines([str(tmp_path)], 'run') == [
      f'slice run-b (driver pid {os.getpid()}): back, joining at the next '
      'step boundary'
  ]
  assert _after(group, _ended(75, regrew=True)) == policy.Resize('grow')
  assert elastic.status_lines([str(tmp_path)], 'run') == [
      f'slice run-b (driver pid {os.getpid()}): in the job'
  ]


def test_status_ignores_a_driver_that_has_ended(tmp_path):
  dead = subprocess.Popen(['true'])
  dead.wait()
  files.write_json(str(tmp_path / elastic.STATUS_FILE), {
      'tpu': 'run',
      'pid': dead.pid,
      'slices': {
          'run-b': {
              'state': 'x'
          }
      }
  })
  assert elastic.status_lines([str(tmp_path)], 'run') == []
