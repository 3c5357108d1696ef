"""The one elastic policy (launcher/elastic.py), the local pod's use of it
(launcher/local/elastic.py) and the first
attempt's per-device batch as the limit of the next
(runtime/checkpoints/batch_limit.py)."""

import ast
import pathlib

from ml_collections import ConfigDict
import pytest

from launcher import agent
from launcher import attempts
from launcher import elastic as policy
from launcher import restart
from launcher.local import elastic
from runtime import batch_layout
from runtime.checkpoints import batch_limit
from runtime.parallelism import microbatches
from runtime import options as options_lib
from runtime.common import records
from runtime.common import layout

pytestmark = pytest.mark.unit


def _run(start, restarts, logs_dir, **fields):
  """The job agent over attempts that `start(number)` makes."""
  return agent.run(
      agent.Job(start=lambda begun: start(begun.number),
                restarts=restarts,
                logs_dir=str(logs_dir),
                **fields))


class _Units:
  """An elastic.Capacity of `running` units, at least `minimum`."""
  flag = '--min_units'

  def __init__(self, running: int, minimum: int):
    self.current, self.minimum, self.back = running, minimum, 0

  def running(self):
    return self.current

  def describe(self):
    return f'{self.current} unit(s)'

  def lose(self, end):
    self.current -= len(end.lost)
    return f'{len(end.lost)} lost'

  def waiting(self):
    return 3.0, 'waiting 3 s'

  def take_back(self):
    self.back += 1
    return 'back'


@pytest.mark.parametrize(
    'exit_code,regrew,lost,left,decided',
    [
        (75, True, 0, 4, policy.GROW),  # stopped so that the job grows
        (137, True, 1, 3, policy.SHRINK),  # a loss during a stop to grow
        (137, False, 1, 3, policy.SHRINK),
        (137, False, 2, 2, policy.SHRINK),  # exactly --min left
        (137, False, 2, 1, policy.WAIT),
        (75, False, 0, 4, None),  # a preemption: the restart rules
        (1, False, 0, 4, None),  # a failure: the restart rules
    ])
def test_one_policy_decides_after_every_attempt(exit_code, regrew, lost, left,
                                                decided):
  units = _Units(running=left + lost, minimum=2)
  said = []
  resized = policy.Policy(units, said.append).after(
      attempts.AttemptEnd(exit_code,
                          progressed=True,
                          regrew=regrew,
                          lost=tuple(range(lost))))
  assert (resized and resized.kind) == decided
  assert units.running() == left and units.back == (decided == policy.GROW)
  if decided == policy.WAIT:
    assert resized.wait_s == 3 and said == [
        f'{lost} lost: {left} left, fewer than --min_units=2; waiting 3 s'
    ]


def test_a_loss_before_any_step_is_no_lost_host():
  units = _Units(running=4, minimum=2)
  assert policy.Policy(units, print).after(
      attempts.AttemptEnd(137, progressed=False, lost=(1,))) is None
  assert units.running() == 4


def test_a_resize_kind_is_one_of_three_and_recorded_as_its_word():
  assert policy.Resize('shrink') == policy.Resize(policy.SHRINK)
  assert policy.Resize(policy.WAIT, 3).kind.value == 'wait'
  with pytest.raises(ValueError, match="'halve'; one of"):
    policy.Resize('halve')


def _lost(*indices) -> attempts.AttemptEnd:
  return attempts.AttemptEnd(137,
                             progressed=True,
                             lost=indices,
                             fault=records.Fault(at=0,
                                                 detected=0,
                                                 process_index=indices[0],
                                                 exit_code=137))


def test_a_loss_shrinks_while_enough_are_left_then_waits():
  clock = [100.0]
  capacity = elastic.Capacity(full=4,
                              minimum=3,
                              regrow_after_s=30,
                              clock=lambda: clock[0])
  resize = policy.Policy(capacity, print).after
  assert resize(_lost(3)) == policy.Resize(policy.SHRINK)
  assert capacity.describe() == '3 of 4 process(es), 1 coming back'
  assert not capacity.grow_due(now=129) and capacity.grow_due(now=130)
  # A second loss leaves 2 < 3: wait until the first lost one is back.
  clock[0] = 110
  assert resize(_lost(1)) == policy.Resize(policy.WAIT, 20)
  for now, processes in ((125, 2), (130, 3), (140, 4)):
    clock[0] = now
    assert capacity.ready(now) and capacity.running() == processes
  assert not capacity.returns


def test_min_processes_equal_to_the_pod_waits_for_every_host():
  clock = [0.0]
  capacity = elastic.Capacity(full=2,
                              minimum=2,
                              regrow_after_s=5,
                              clock=lambda: clock[0])
  assert policy.Policy(capacity,
                       print).after(_lost(0)) == policy.Resize(policy.WAIT, 5)


@pytest.mark.parametrize('minimum,regrow', [(0, 1), (5, 1), (2, -1)])
def test_bad_elastic_flags_are_refused(minimum, regrow):
  with pytest.raises(ValueError, match='--min_processes|--regrow_after'):
    elastic.Capacity(full=4, minimum=minimum, regrow_after_s=regrow)


def test_which_exits_are_lost_hosts():
  assert elastic.is_lost_process(137, ())
  assert elastic.is_lost_process(42, (42,))
  assert not elastic.is_lost_process(75, (75,))
  assert not elastic.is_lost_process(1, ())


class _Pod:
  """An attempts.Attempt that ends as it is told."""

  def __init__(self,
               code,
               fault_code=None,
               progressed=True,
               regrew=False,
               processes=4,
               furthest_step=None):
    self.end = attempts.AttemptEnd(
        code,
        progressed=progressed,
        regrew=regrew,
        processes=processes,
        counts_steps=furthest_step is not None,
        furthest_step=furthest_step,
        fault=(records.Fault(
            at=0, detected=0, process_index=3, exit_code=fault_code)
               if fault_code else None),
        lost=(3,) if fault_code else ())

  def run(self) -> attempts.AttemptEnd:
    return self.end


def test_shrinks_and_growths_use_no_restart(tmp_path, capsys):
  clock = [0.0]
  capacity = elastic.Capacity(full=4,
                              minimum=3,
                              regrow_after_s=10,
                              clock=lambda: clock[0])
  pods = iter([_Pod(137, 137), _Pod(75, regrew=True, processes=3), _Pod(0)])
  said = []
  code = _run(lambda attempt: next(pods),
              restart.RestartPolicy(0, 0, ()),
              logs_dir=str(tmp_path),
              say=said.append,
              capacity=capacity,
              elastic=True)
  assert code == 0
  assert any(
      'rank 3 lost (exit code 137): starting again at once on 3 of 4' in line
      for line in said), said
  assert said[-1] == ('job ended with exit code 0 after 0 restart(s): 0 '
                      'preemption(s), 0 retryable failure(s); 1 shrink(s), '
                      '1 growth(s) and 0 wait(s) for capacity')
  kept = records.read_attempts(str(tmp_path / 'attempts.jsonl'))
  assert [(a.resize, a.processes) for a in kept] == [('shrink', 4), ('grow', 3),
                                                     (None, 4)]


@pytest.mark.parametrize('max_restarts', [0, 2])
def test_a_loss_at_the_same_step_each_time_ends_after_the_bound(
    tmp_path, max_restarts):
  # Rank 3 dies 137 at step 40 on any number of processes: the first loss
  # shrinks (steps 1-39 were new), and every later one, which only trained
  # again up to 39, uses a restart.
  capacity = elastic.Capacity(full=8, minimum=2, regrow_after_s=1e9)
  attempts = []

  def start(attempt):
    attempts.append(attempt)
    return _Pod(137, 137, furthest_step=39)

  said = []
  code = _run(start,
              restart.RestartPolicy(max_restarts, 0, ()),
              logs_dir=str(tmp_path),
              say=said.append,
              capacity=capacity,
              elastic=True)
  assert code == 137
  assert attempts == list(range(1, max_restarts + 3))
  assert any(f'--max_restarts={max_restarts} is used up' in line
             for line in said), said
  assert ('shrink after exit code 137 counted as restart 1/2: the attempt '
          'trained no step past 39, reached before'
          in said) == (max_restarts == 2)
  kept = records.read_attempts(str(tmp_path / 'attempts.jsonl'))
  assert [a.resize for a in kept] == ['shrink'] * (max_restarts + 1) + [None]


def test_losses_that_each_train_new_steps_shrink_freely(tmp_path):
  capacity = elastic.Capacity(full=4, minimum=2, regrow_after_s=1e9)
  pods = iter([
      _Pod(137, 137, furthest_step=10),
      _Pod(137, 137, processes=3, furthest_step=12),
      _Pod(0, processes=2, furthest_step=20)
  ])
  code = _run(lambda attempt: next(pods),
              restart.RestartPolicy(0, 0, ()),
              logs_dir=str(tmp_path),
              say=lambda line: None,
              capacity=capacity,
              elastic=True)
  assert code == 0 and capacity.current == 2


def test_a_growth_uses_no_restart_even_without_a_new_step(tmp_path):
  # The shrunk attempt is stopped to grow before it passes step 10 again.
  clock = [0.0]
  capacity = elastic.Capacity(full=4,
                              minimum=3,
                              regrow_after_s=10,
                              clock=lambda: clock[0])
  pods = iter([
      _Pod(137, 137, furthest_step=10),
      _Pod(75, regrew=True, processes=3, furthest_step=8),
      _Pod(0, furthest_step=30)
  ])
  code = _run(lambda attempt: next(pods),
              restart.RestartPolicy(0, 0, ()),
              logs_dir=str(tmp_path),
              say=lambda line: None,
              capacity=capacity,
              elastic=True)
  assert code == 0


def test_a_loss_before_any_step_follows_the_usual_rules(tmp_path):
  capacity = elastic.Capacity(full=4, minimum=3, regrow_after_s=10)
  code = _run(lambda attempt: _Pod(137, 137, progressed=False),
              restart.RestartPolicy(0, 0, ()),
              logs_dir=str(tmp_path),
              say=lambda line: None,
              capacity=capacity,
              elastic=True)
  assert code == 137 and capacity.current == 4


def _config(**fields) -> ConfigDict:
  return ConfigDict({
      'global_batch_size': 256,
      'device_batch_limit': 0,
      'microbatches': 0,
      **fields
  })


def _remember(config, workdir, devices):
  batch_limit.remember(
      options_lib.Groups.of(config).steered(), layout.Record(workdir),
      microbatches.plan(config.global_batch_size, devices))


def _first(config, record):
  return batch_limit.first_group_size(config.global_batch_size,
                                      options_lib.Groups.of(config).steered(),
                                      record)


def test_the_first_attempts_group_size_is_kept_by_later_ones(tmp_path):
  # Nothing is kept until a step has run (`remember`, after the first call).
  assert _first(_config(), layout.Record(str(tmp_path))) == (None, '')
  _remember(_config(), str(tmp_path), 8)
  # A smaller attempt: 32 a pass, not 64; the layout line says why.
  size, note = _first(_config(), layout.Record(str(tmp_path)))
  assert size == 32 and note == (
      "groups of 32 as the job's first attempt on 8 device(s) "
      '(device_batch_limit.json)')
  # A later attempt does not overwrite the first's.
  _remember(_config(), str(tmp_path), 4)
  assert _first(_config(), layout.Record(str(tmp_path)))[0] == 32
  for fixed in ({
      'device_batch_limit': 16
  }, {
      'microbatches': 2
  }, {
      'microbatch_size': 8
  }):
    assert _first(_config(**fixed),
                  layout.Record(str(tmp_path))) == (None, ''), fixed


def test_a_kept_group_size_of_another_global_batch_is_ignored(tmp_path):
  _remember(_config(global_batch_size=256), str(tmp_path), 8)
  size, note = _first(_config(global_batch_size=128),
                      layout.Record(str(tmp_path)))
  assert size is None and note == (
      'device_batch_limit.json (groups of 32) was made for global batch '
      '256, not 128: ignored')
  # The run that then trains keeps its own.
  _remember(_config(global_batch_size=128), str(tmp_path), 8)
  assert _first(_config(global_batch_size=128),
                layout.Record(str(tmp_path)))[0] == 16


def test_an_elastic_job_keeps_its_groups_on_any_number_of_devices(tmp_path):
  # 40 on 8 devices: groups of 5. On 6, left to choose, groups of 4 (fewest
  # passes, then least padding) would change BatchNorm's statistics; kept,
  # 5 costs the same 2 passes.
  _remember(_config(global_batch_size=40), str(tmp_path), 8)
  assert _first(_config(global_batch_size=40),
                layout.Record(str(tmp_path)))[0] == 5
  assert microbatches.plan(40, 6, device_batch_limit=5).microbatch_size == 4
  kept = microbatches.plan(40, 6, microbatch_size=5)
  assert (kept.microbatch_size, kept.microbatches, kept.padded_groups) == (5, 2,
                                                                           4)


def test_a_config_one_elastic_topology_cannot_lay_out_is_refused_first():
  # One pass of at most 40 examples: 256 fits on 4 x 2 devices (32 each),
  # not on 2 x 2 (64 each), which --min_processes=2 allows.
  batch_layout.check_elastic_layouts(256, 2, (40, 1, None), elastic=(4, 4))
  with pytest.raises(microbatches.LayoutError,
                     match=r'this elastic job may run on 2 to 4 processes, '
                     r'and on 2 x 2 devices: global batch size 256 in 1 '
                     r'microbatch\(es\) on 4 devices needs groups of 64'):
    batch_layout.check_elastic_layouts(256, 2, (40, 1, None), elastic=(2, 4))
  # Left to choose, the groups change with the count (BatchNorm would);
  # a fixed group size keeps them.
  assert batch_layout.check_elastic_layouts(40,
                                            2, (5, None, None),
                                            elastic=(3, 4)) == {4, 5}
  assert batch_layout.check_elastic_layouts(40,
                                            2, (None, None, 5),
                                            elastic=(3, 4)) == {5}
  assert batch_layout.check_elastic_layouts(256,
                                            2, (None, None, None),
                                            elastic=None) == set()


def test_one_class_decides_a_resize():
  """The local pod, the TPU slices and Ray each give an elastic.Capacity;
  no module but launcher/elastic.py builds a Resize or names a kind of
  one but GROW (restart.py reads that one: a growth uses no restart)."""
  root = pathlib.Path(__file__).resolve().parent.parent
  found = []
  for path in sorted((root / 'launcher').rglob('*.py')):
    if path == root / 'launcher' / 'elastic.py':
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      called = isinstance(node, ast.Call)
      named = node.func if called else node
      name = (named.attr if isinstance(named, ast.Attribute) else
              named.id if isinstance(named, ast.Name) else None)
      if (name in ('SHRINK', 'WAIT', 'decide') or
          called and name in ('Resize', 'Kind')):
        found.append(f'{path.relative_to(root)}:{node.lineno} {name}')
  assert found == []


def test_the_three_capacities_are_driven_through_one_protocol():
  """Local pods, Ray jobs and TPU slices each implement every method of
  elastic.Capacity with its signature, and nothing of it under another
  name."""
  import inspect  # pylint: disable=g-import-not-at-top
  from launcher.ray import elastic as ray_elastic  # pylint: disable=g-import-not-at-top
  from launcher.tpu import elastic as tpu_elastic  # pylint: disable=g-import-not-at-top
  methods = [
      name for name, member in vars(policy.Capacity).items()
      if callable(member) and not name.startswith('_')
  ]
  assert set(methods) == {
      'running', 'describe', 'lose', 'grow_due', 'take_back', 'waiting', 'ready'
  }
  for capacity in (elastic.Capacity, ray_elastic.Capacity,
                   tpu_elastic.SliceGroup):
    for name in methods:
      wanted = list(
          inspect.signature(getattr(policy.Capacity, name)).parameters)
      got = list(inspect.signature(getattr(capacity, name)).parameters)
      assert got == wanted, (capacity.__qualname__, name, got, wanted)
    for old in ('wait', 'regrow_due', 'processes_back', 'ready_for_attempt'):
      assert not hasattr(capacity, old), (capacity.__qualname__, old)
