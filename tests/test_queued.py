"""launcher/tpu/queued.py and flags.py without gcloud: requests, phases,
the wait's per-phase clock, and the flags that go with --create."""

import pytest

from launcher.tpu import commands
from launcher.tpu import flags
from launcher.tpu import queued
from runtime.common import exit_codes

pytestmark = pytest.mark.unit


def test_a_request_becomes_the_sdks_create_arguments():
  one = queued.Request('run7', ('run7',), 'v4-32', 'img', tier='spot',
                       valid_until='6h')
  assert one.create_args() == [
      'run7', '--accelerator-type=v4-32', '--runtime-version=img',
      '--node-id=run7', '--spot', '--valid-until-duration=6h']
  two = queued.Request('run7', queued.node_names('run7', 2), 'v5p-128',
                       'img', tier='reserved',
                       valid_until='2026-12-02T00:00:00Z')
  assert two.nodes == ('run7-0', 'run7-1')
  assert two.create_args()[3:] == [
      '--node-count=2', '--node-prefix=run7', '--reserved',
      '--valid-until-time=2026-12-02T00:00:00Z']
  assert '--spot' not in queued.Request('r', ('r',), 'v4-8',
                                        'img').create_args()


@pytest.mark.parametrize('qr,nodes,phase', [
    ('ACCEPTED', {}, 'capacity'),
    ('WAITING_FOR_RESOURCES', {}, 'capacity'),
    ('PROVISIONING', {'n': ('CREATING', '')}, 'provisioning'),
    ('ACTIVE', {'n': ('CREATING', '')}, 'ready'),
    ('ACTIVE', {'n': ('READY', 'TIMEOUT')}, 'ready'),
    ('ACTIVE', {'n': ('READY', 'HEALTHY'), 'm': ('READY', '')}, 'up'),
    ('ACTIVE', {'n': ('READY', 'HEALTHY'), 'm': ('PREEMPTED', '')}, 'lost'),
    ('SUSPENDING', {'n': ('PREEMPTED', '')}, 'lost'),
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
  fleet, said = _fleet(monkeypatch, [
      WAITING, WAITING, queued.Observation('PROVISIONING', {}), UP])
  assert fleet.wait_up() == UP and fleet.up
  assert said == ['run7: queued resource WAITING_FOR_RESOURCES',
                  'run7: queued resource PROVISIONING',
                  'run7: queued resource ACTIVE; node(s) run7 READY/HEALTHY']


def test_a_phase_past_its_timeout_is_named(monkeypatch):
  fleet, _ = _fleet(monkeypatch, [WAITING] * 1000, timeouts=(0.05, 60, 60))
  with pytest.raises(commands.LaunchError) as e:
    fleet.wait_up()
  assert e.value.exit_code == exit_codes.POD_UNAVAILABLE
  assert ('the capacity phase took over 0.05 s (--capacity_timeout)' in
          str(e.value))


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
    (['--create', '--accelerator_type=v4-8', '--runtime_version=i',
      '--poll_interval=0'], '--poll_interval must be positive'),
])
def test_flags_that_do_not_go_together(argv, message, capsys):
  with pytest.raises(SystemExit):
    flags.parse(['--tpu=t', '--zone=z', *argv], ['--config=c.py'])
  assert message in capsys.readouterr().err


def test_the_tier_and_the_queued_resource_name():
  options, launcher_args = flags.parse(
      ['--tpu=t', '--zone=z', '--create', '--accelerator_type=v4-8',
       '--runtime_version=i', '--reserved', '--workdir=w'], ['--config=c'])
  assert (options.tier, options.queued_resource) == ('reserved', 't')
  assert launcher_args == ['--config=c', '--workdir=w']
