"""podrun-ray's own parts, without a cluster: its flags, a bundle as Ray's
actor options, and the environment a node's process starts with. The job on
a real Ray cluster: test_ray_processes.py."""

import socket
import subprocess
import sys

import pytest

from launcher import attempts
from launcher import elastic as policy
from launcher.common import flag_values
from launcher.ray import __main__ as ray_main
from launcher.ray import attempt
from launcher.ray import driver
from launcher.ray import elastic
from launcher.ray import host
from launcher.ray import options as options_lib
from launcher.ray import raylets
from runtime.common import handoff
from tests import helpers
from tests import ray_cluster  # pylint: disable=unused-import; before Ray

pytestmark = pytest.mark.unit


def test_flags_and_the_launchers_after_the_separator():
  options = ray_main.parse([
      '--address=10.0.0.1:6379', '--num_processes=4',
      '--resources_per_process={"GPU": 8, "CPU": 16}', '--',
      '--config=configs/mnist.py', '--workdir=/shared/mnist'
  ])
  assert options == options_lib.RayFlags(
      '10.0.0.1:6379', 4, {
          'GPU': 8.0,
          'CPU': 16.0
      },
      flag_values.LaunchArgs(
          ['--config=configs/mnist.py', '--workdir=/shared/mnist']))
  assert options.launcher_args.workdir == '/shared/mnist'
  # The user's variables, for every process.
  options = ray_main.parse([
      '--num_processes=2', '--env=WANDB_API_KEY=k', '--env',
      'XLA_FLAGS=--xla_dump_to=/tmp/x=1', '--', '--config=c', '--workdir=/w'
  ])
  assert options.env == {
      'WANDB_API_KEY': 'k',
      'XLA_FLAGS': '--xla_dump_to=/tmp/x=1'
  }


@pytest.mark.parametrize('argv, says', [
    (['--num_processes=0', '--', '--config=c', '--workdir=/w'
     ], '--num_processes=0: at least'),
    (['--num_processes=2'], 'no launcher flags after `--`'),
    (['--num_processes=2', '--env=1A=b', '--', '--config=c', '--workdir=/w'
     ], '--env 1A=b: expected KEY=VALUE'),
    ([
        '--num_processes=2', '--resources_per_process={"GPU": 0}', '--',
        '--config=c', '--workdir=/w'
    ], 'positive amounts'),
    ([
        '--num_processes=2', '--resources_per_process=GPU', '--', '--config=c',
        '--workdir=/w'
    ], 'not JSON'),
    (['--num_processes=2', '--', '--config=c'], 'no --workdir among'),
    ([
        '--num_processes=2', '--retry_exit_codes=137,2', '--', '--config=c',
        '--workdir=/w'
    ], 'cannot be retried'),
    ([
        '--num_processes=2', '--min_processes=3', '--', '--config=c',
        '--workdir=/w'
    ], '--min_processes=3 with --num_processes=2: it must'),
    ([
        '--num_processes=2', '--min_replicas=3', '--', '--config=c',
        '--workdir=/w'
    ], '--min_replicas=3 with --num_processes=2: it must'),
    ([
        '--num_processes=4', '--min_processes=3', '--min_replicas=3', '--',
        '--config=c', '--workdir=/w'
    ], 'count the same processes'),
    (['--num_processes=2', '--', '--config=c', '--workdir=runs/a'
     ], "--workdir=runs/a: a relative path would land in each node's own copy"),
    ([
        '--num_processes=2', '--project_max_mb=0', '--', '--config=c',
        '--workdir=/w'
    ], '--project_max_mb=0: must be positive'),
])
def test_bad_flags_are_named(argv, says, capsys):
  with pytest.raises(SystemExit) as exited:
    ray_main.parse(argv)
  assert exited.value.code == 2
  assert says in capsys.readouterr().err


@pytest.mark.parametrize('make, says', [
    (lambda root: (root / 'launcher.py').write_text(''),
     'holds launcher.py, which on every host would be imported'),
    (lambda root: (root / 'big.bin').write_bytes(b'x' * (2 << 20)),
     'over --project_max_mb=1; the biggest: big.bin (2.0 MiB)'),
    (lambda root: root.rmdir(), ': no such directory'),
])
def test_a_project_that_cannot_travel_exits_2_before_ray_is_asked(
    tmp_path, make, says):
  """Before ray.init: no cluster answers at --address, and none is asked."""
  root = tmp_path / 'my_project'
  root.mkdir()
  make(root)
  result = subprocess.run([
      sys.executable, '-m', 'launcher.ray', '--address=127.0.0.1:9',
      '--num_processes=2', f'--project_dir={root}', '--project_max_mb=1', '--',
      '--config=my_config.py', f'--workdir={tmp_path / "w"}'
  ],
                          env=helpers.launcher_env(),
                          capture_output=True,
                          text=True,
                          timeout=60,
                          check=False)
  assert result.returncode == 2, result.stderr
  assert says in result.stderr
  assert 'no Ray cluster' not in result.stderr


def test_a_bundle_becomes_rays_actor_options():
  pytest.importorskip('ray')
  from launcher.ray import group  # pylint: disable=g-import-not-at-top
  assert group.actor_options({
      'GPU': 8.0,
      'CPU': 4.0
  }) == {
      'num_cpus': 4.0,
      'num_gpus': 8.0
  }
  assert group.actor_options({'TPU': 4.0}) == {
      'num_cpus': 0,
      'num_gpus': 0,
      'resources': {
          'TPU': 4.0
      }
  }


def test_a_process_inherits_nothing_of_an_earlier_job():
  """A replacement node may carry a stale place or multislice set-up."""
  node = {
      'PATH': '/usr/bin',
      'PODRUN_PROCESS_ID': '3',
      'PODRUN_COORDINATOR_ADDRESS': 'old:1',
      'PODRUN_ATTEMPT': 'x-a3',
      'PODRUN_GONE_FILE': '/old/gone',
      'MEGASCALE_SLICE_ID': '1',
      'CUDA_VISIBLE_DEVICES': '0,1',
      'PODRUN_LOCAL_CHECKPOINT_DIR': '/mnt/ssd/podrun'
  }
  env = host.fresh_env(node, handoff.Handoff(process_id=0, num_processes=4))
  # The node's own settings stay.
  assert env == {
      'PATH': '/usr/bin',
      'CUDA_VISIBLE_DEVICES': '0,1',
      'PODRUN_LOCAL_CHECKPOINT_DIR': '/mnt/ssd/podrun',
      'PODRUN_PROCESS_ID': '0',
      'PODRUN_NUM_PROCESSES': '4'
  }
  # The user's variables go in; what the launcher tells wins over them.
  env = host.fresh_env(node, handoff.Handoff(process_id=0), {
      'WANDB_API_KEY': 'k',
      'PODRUN_PROCESS_ID': '9'
  })
  assert env['WANDB_API_KEY'] == 'k' and env['PODRUN_PROCESS_ID'] == '0'


def test_no_cluster_at_the_address_is_named(monkeypatch, capsys):
  """What `ray.init` raises when it finds no cluster (measured: 'auto' with
  none running) ends podrun-ray with 6, naming the address."""
  ray = pytest.importorskip('ray')

  def no_cluster(**kwargs):
    raise ConnectionError('Could not find any running Ray instance.')

  monkeypatch.setattr(ray, 'init', no_cluster)
  options = ray_main.parse(
      ['--num_processes=2', '--', '--config=c', '--workdir=/w'])
  assert driver.run(options) == 6
  assert ('error: no Ray cluster at --address=auto: Could not find any '
          'running Ray instance.' in capsys.readouterr().err)


def test_min_processes_makes_the_job_elastic():
  options = ray_main.parse([
      '--num_processes=4', '--min_processes=3', '--', '--config=c',
      '--workdir=/w'
  ])
  assert options.min_processes == 3
  said_in_replicas = ray_main.parse([
      '--num_processes=4', '--min_replicas=3', '--', '--config=c',
      '--workdir=/w'
  ])
  assert said_in_replicas.min_processes == 3
  assert elastic.Capacity(4, 3).elastic
  assert not elastic.Capacity(4, 4).elastic


def _ended(code, lost, progressed=True, regrew=False):
  """How a Ray attempt ended, as the policy reads it."""
  return attempts.AttemptEnd(code,
                             progressed=progressed,
                             regrew=regrew,
                             lost=tuple(lost))


def test_a_lost_node_shrinks_a_node_back_grows_too_few_wait():
  capacity = elastic.Capacity(full=4, minimum=2)
  said = []
  resize = policy.Policy(capacity, said.append).after
  assert resize(_ended(137, [2])) == policy.Resize(policy.SHRINK)
  assert capacity.current == 3 and 'rank(s) 2 lost' in said[-1]
  assert capacity.describe() == ('3 of 4 process(es), 1 to come back when Ray '
                                 'has a node for each')
  # The stop to grow (75) after one spare node: back to 4.
  capacity.look = lambda: 1  # What the attempt's group sees (attempt.py).
  assert capacity.grow_due(now=0.0) and capacity.spare == 1
  assert resize(_ended(75, [], regrew=True)) == policy.Resize(policy.GROW)
  assert capacity.current == 4
  # Three nodes at once leave 1 < 2: the next attempt asks for 2.
  assert resize(_ended(137, [0, 1, 3])) == policy.Resize(policy.WAIT)
  assert 'waits for 2 nodes' in said[-1]
  assert capacity.ready(now=0.0) and capacity.current == 2


def test_what_is_no_lost_node_follows_the_restart_rules():
  capacity = elastic.Capacity(full=4, minimum=2)
  resize = policy.Policy(capacity, print).after
  assert resize(_ended(1, [])) is None  # a failure
  assert resize(_ended(75, [])) is None  # a preemption
  assert resize(_ended(137, [1], progressed=False)) is None  # no step yet
  assert capacity.current == 4


def test_a_raylet_is_gone_when_its_port_takes_no_connection():
  # A live raylet's kernel completes the handshake however busy it is; a
  # dead one's port refuses (its machine up) or times out (its machine gone).
  listener = socket.socket()
  listener.bind(('127.0.0.1', 0))
  listener.listen()
  address = listener.getsockname()
  assert not raylets.gone(address)
  listener.close()
  assert raylets.gone(address)
  assert not raylets.gone(None)  # A node Ray did not list: no verdict.


class _Silent:
  """A group.Group as Silence reads it: silent ranks, and raylets asked."""

  def __init__(self, silent, dead_raylets):
    self.silent = dict.fromkeys(silent, 0.0)
    self.dead_raylets = set(dead_raylets)
    self.asked = []

  def raylet_gone(self, process_index):
    self.asked.append(process_index)
    return process_index in self.dead_raylets


def test_a_silent_ranks_raylet_is_asked_once_a_second_until_found_gone():
  silence = attempt.Silence()
  group = _Silent(silent=[1, 3], dead_raylets=[3])
  assert silence.news(group, 10.0) == ([1, 3], [3])
  assert silence.news(group, 10.5) == ([], [])  # Asked under a second ago.
  assert group.asked == [1, 3]
  group.dead_raylets.add(1)
  assert silence.news(group, 11.0) == ([], [1])  # 3, dead, is not asked.
  assert group.asked == [1, 3, 1]
  assert (silence.gone, silence.dead) == ({1, 3}, {1, 3})
  group.silent[2] = 11.2  # Silent, its node's raylet answering.
  assert silence.news(group, 11.2) == ([2], [])
  assert silence.news(group, 12.0) == ([], [])
  assert group.asked == [1, 3, 1, 2]


def test_naming_podrun_rays_parts_does_not_import_ray():
  # Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when it is imported:
  # imported first by these unit tests, it took the machine's address for
  # 127.0.0.1, and the Ray tests that ran after them in the same worker
  # could not reach their own cluster (seen once in a full run).
  code = ('import sys\n'
          'from launcher.ray import __main__, attempt, driver, elastic, host\n'
          'from launcher.ray import raylets\n'
          'print("ray" in sys.modules)')
  result = subprocess.run([sys.executable, '-c', code],
                          check=True,
                          capture_output=True,
                          text=True,
                          cwd=helpers.REPO)
  assert result.stdout.strip() == 'False'
