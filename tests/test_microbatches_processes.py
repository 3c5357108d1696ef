"""The same step on any number of devices, across real processes.

256 examples on 3 processes x 2 devices (4 groups of 64, 2 devices of
padding) against 1 x 8 after 60 steps; a checkpoint of 2x4 resumed on 3x2
and on 1x8 with a device batch limit (runtime/parallelism/microbatches.py).
The CNN with BatchNorm and dropout on 1x8, 2x4 and 3x2 devices with the
same groups is in tests/test_mnist_cnn_processes.py, which trains its 1x8
run once for both.
"""

import shutil

import numpy as np
import pytest

from runtime import data
from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(400)]

PROBE = [
    f'--config={helpers.PROBE_CONFIG}', '--config.global_batch_size=256',
    '--config.record_ids=True', '--config.nan_on_padding=True',
    '--config.log_every=10', '--config.data.num_examples=1000'
]
THREE_BY_TWO = ['--local_processes=3', '--local_devices=2']


def _run(workdir, *args, timeout=200):
  result = helpers.run_launcher([*PROBE, f'--workdir={workdir}', *args],
                                timeout=timeout)
  assert result.returncode == 0, result.output
  return result


def _ids(workdir, processes: int) -> np.ndarray:
  """(steps, G): each step's examples, the processes' in order."""
  return np.concatenate(
      [np.load(workdir / 'ids' / f'rank_{i}.npy') for i in range(processes)],
      axis=1)


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
  """1x8, 60 steps: the run every other one is compared with."""
  workdir = tmp_path_factory.mktemp('straight')
  _run(workdir, '--config.steps=60')
  return workdir


def test_3x2_matches_1x8_and_padding_never_reaches_the_loss(tmp_path, straight):
  result = _run(tmp_path / '3x2', '--config.steps=60', *THREE_BY_TWO)
  assert ('global batch 256 (1 microbatch(es) of 64 example(s) per device, '
          '2 of 6 group(s) padding (33% of the passes))') in result.stderr
  # Process 2's devices hold padding alone: it reads no example.
  assert np.load(tmp_path / '3x2' / 'ids' / 'rank_2.npy').shape == (60, 0)
  ids = _ids(tmp_path / '3x2', 3)
  for step in (0, 7, 59):
    np.testing.assert_array_equal(
        ids[step], data.global_batch_ids(step, 256, 1000, seed=0))
  np.testing.assert_array_equal(ids, _ids(straight, 1))
  states = [helpers.final_state(w) for w in (straight, tmp_path / '3x2')]
  helpers.assert_trees_close(states[0]['params'],
                             states[1]['params'],
                             rtol=1e-5,
                             atol=1e-6)
  rows = helpers.read_jsonl(tmp_path / '3x2' / 'metrics.jsonl')
  assert {
      (r['num_processes'], r['num_devices'], r['microbatches']) for r in rows
  } == {(3, 6, 1)}
  summary = helpers.read_json(tmp_path / '3x2' / 'summary.json')
  assert summary['results']['topology'] == {
      'num_processes': 3,
      'num_devices': 6,
      'microbatches': 1
  }
  ledger = next((tmp_path / '3x2' / 'goodput').glob('*/rank_2.json'))
  assert helpers.read_json(ledger)['notes']['topology']['num_devices'] == 6


def test_a_2x4_checkpoint_resumes_on_3x2_and_on_1x8_with_a_limit(
    tmp_path, straight):
  _run(tmp_path / 'first', '--config.steps=30', '--local_processes=2',
       '--local_devices=4')
  for name, args, processes in (('3x2', THREE_BY_TWO, 3),
                                ('1x8_limit', ['--config.device_batch_limit=8'],
                                 1)):
    shutil.copytree(tmp_path / 'first' / 'checkpoints',
                    tmp_path / name / 'checkpoints')
    result = _run(tmp_path / name, '--config.steps=60', *args)
    assert 'resuming at step 30' in result.stderr, result.stderr
    # The examples of steps 30..59 are those of the run that never stopped.
    np.testing.assert_array_equal(_ids(tmp_path / name, processes),
                                  _ids(straight, 1)[30:])
    helpers.assert_trees_close(helpers.final_state(tmp_path / name)['params'],
                               helpers.final_state(straight)['params'],
                               rtol=1e-5,
                               atol=1e-6)
  rows = helpers.read_jsonl(tmp_path / '1x8_limit' / 'metrics.jsonl')
  assert rows[-1]['microbatches'] == 4  # 32 a device, 8 at a time.
