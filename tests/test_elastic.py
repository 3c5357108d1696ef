"""The elastic local pod's policy (launcher/local/elastic.py) and the first
attempt's per-device batch as the limit of the next (runtime/batch_limit.py)."""

from ml_collections import ConfigDict
import pytest

from launcher import restart
from launcher.local import elastic
from runtime import batch_limit
from runtime.common import records

pytestmark = pytest.mark.unit


def test_a_loss_shrinks_while_enough_are_left_then_waits():
  capacity = elastic.Capacity(full=4, minimum=3, regrow_after_s=30)
  assert capacity.after_lost(now=100) == elastic.Resize(elastic.SHRINK)
  assert capacity.describe() == '3 of 4 process(es), 1 coming back'
  assert not capacity.regrow_due(now=129) and capacity.regrow_due(now=130)
  # A second loss leaves 2 < 3: wait until the first lost one is back.
  assert capacity.after_lost(now=110) == elastic.Resize(elastic.WAIT, 20)
  assert capacity.take_back(now=125) == 2
  assert capacity.take_back(now=130) == 3
  assert capacity.take_back(now=140) == 4 and not capacity.returns


def test_min_processes_equal_to_the_pod_waits_for_every_host():
  capacity = elastic.Capacity(full=2, minimum=2, regrow_after_s=5)
  assert capacity.after_lost(now=0) == elastic.Resize(elastic.WAIT, 5)


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
  def __init__(self, code, fault_code=None, progressed=True, regrew=False,
               processes=4):
    self.code, self.progressed, self.regrew = code, progressed, regrew
    self.num_processes = processes
    self.fault = (records.Fault(at=0, detected=0, rank=3,
                                exit_code=fault_code)
                  if fault_code else None)
    self.launcher_signalled = False

  def run(self):
    return self.code


def test_shrinks_and_growths_use_no_restart(tmp_path, capsys):
  clock = [0.0]
  capacity = elastic.Capacity(full=4, minimum=3, regrow_after_s=10)
  pods = iter([_Pod(137, 137), _Pod(75, regrew=True, processes=3),
               _Pod(0)])
  said = []
  code = restart.run(
      lambda attempt: next(pods), max_restarts=0, first_backoff_s=0,
      retryable=(), logs_dir=str(tmp_path), say=said.append,
      resize=elastic.resize_after(capacity, (), said.append,
                                  now=lambda: clock[0]))
  assert code == 0
  assert any('rank 3 lost (exit code 137): starting again at once on 3 of 4'
             in line for line in said), said
  assert said[-1] == ('job ended with exit code 0 after 0 restart(s): 0 '
                      'preemption(s), 0 retryable failure(s); 1 shrink(s), '
                      '1 growth(s) and 0 wait(s) for capacity')
  kept = records.read_attempts(str(tmp_path / 'attempts.jsonl'))
  assert [(a.resize, a.processes) for a in kept] == [
      ('shrink', 4), ('grow', 3), (None, 4)]


def test_a_loss_before_any_step_follows_the_usual_rules(tmp_path):
  capacity = elastic.Capacity(full=4, minimum=3, regrow_after_s=10)
  code = restart.run(
      lambda attempt: _Pod(137, 137, progressed=False), max_restarts=0,
      first_backoff_s=0, retryable=(), logs_dir=str(tmp_path),
      say=lambda line: None,
      resize=elastic.resize_after(capacity, (), lambda line: None))
  assert code == 137 and capacity.current == 4


def _config(**fields) -> ConfigDict:
  return ConfigDict({'global_batch_size': 256, 'device_batch_limit': 0,
                     'microbatches': 0, **fields})


def test_the_first_attempts_device_batch_is_the_limit_of_later_ones(tmp_path):
  assert batch_limit.device_batch_limit(_config(), str(tmp_path), 8) == 32
  # A smaller attempt: 32 a pass, not 64.
  assert batch_limit.device_batch_limit(_config(), str(tmp_path), 4) == 32
  assert batch_limit.device_batch_limit(
      _config(device_batch_limit=16), str(tmp_path), 4) == 16
  assert batch_limit.device_batch_limit(
      _config(microbatches=2), str(tmp_path), 4) is None
