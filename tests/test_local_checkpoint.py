"""The local tier's storage and the restore every process agrees on."""

import os
import types

import jax
import numpy as np
import pytest

from configs import linear_regression as linear_regression_config
from runtime.checkpoints import checkpoint
from runtime.checkpoints import checkpoint_meta
from runtime.checkpoints import options as checkpoint_options
from runtime.checkpoints import local_checkpoint
from runtime.checkpoints import recovery
from runtime import step as step_lib

pytestmark = pytest.mark.unit


def _state():
  return step_lib.TrainState(params={
      'w': np.array([1.5, -0.0, np.nan], np.float32),
      'b': np.array(2.0, np.float32)
  },
                             model_state={},
                             opt_state=(np.array(7, np.int32), {
                                 'flag': np.array([True, False])
                             }),
                             rng=np.array([3, 4], np.uint32))


def _meta(config, state, step=40):
  return {
      'step': step,
      'data': {
          'num_examples': 100
      },
      'config': checkpoint_options.trajectory_config(config),
      'state': checkpoint_meta.describe_state(state)
  }


def _assert_same_bits(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a),
                  jax.tree_util.tree_leaves(b),
                  strict=True):
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()


def test_a_copy_round_trips_bit_for_bit(tmp_path):
  local = local_checkpoint.LocalCheckpoints(str(tmp_path), every=20)
  state = _state()
  local.save(20, state, {'step': 20})
  local.wait()
  assert local.steps() == [20]
  assert local.meta(20) == {'step': 20}
  _assert_same_bits(local.load(20, state), state)


def test_only_the_newest_copies_are_kept(tmp_path):
  local = local_checkpoint.LocalCheckpoints(str(tmp_path), every=20, keep=2)
  for step in (20, 40, 60):
    local.save(step, _state(), {'step': step})
  local.wait()
  assert local.steps() == [40, 60]
  assert local.due(80) and not local.due(70)


def test_a_torn_save_is_not_a_copy_and_is_removed(tmp_path):
  local = local_checkpoint.LocalCheckpoints(str(tmp_path), every=20)
  local.save(20, _state(), {'step': 20})
  local.wait()
  torn = tmp_path / '.tmp_step_40'
  torn.mkdir()
  (torn / 'state.npz').write_bytes(b'PK\x03\x04 torn')
  again = local_checkpoint.LocalCheckpoints(str(tmp_path), every=20)
  assert again.steps() == [20]
  assert not torn.exists()


def test_clear_and_remove(tmp_path):
  path = tmp_path / 'job' / 'rank_0'
  local = local_checkpoint.LocalCheckpoints(str(path), every=20)
  local.save(20, _state(), {'step': 20})
  local.clear()
  assert local.steps() == [] and path.exists()
  local.remove()
  assert not (tmp_path / 'job').exists()


def test_a_renumbered_process_restores_what_its_disk_holds(tmp_path):
  # Process 1 of attempt a1 copies step 20; in attempt a2 the same host's
  # process is number 0 (an elastic job renumbered it), and its neighbour
  # on this disk is process 1 of a2.
  job = tmp_path / 'job'
  before = local_checkpoint.LocalCheckpoints(str(job / 'rank_1'),
                                             every=20,
                                             attempt='a1')
  before.save(20, _state(), {'step': 20})
  before.wait()
  now = local_checkpoint.LocalCheckpoints(str(job / 'rank_0'),
                                          every=20,
                                          attempt='a2')
  assert now.steps() == [] and list(now.held()) == [20]
  assert now.meta(20) == {'step': 20}
  _assert_same_bits(now.load(20, _state()), _state())
  now.save(40, _state(), {'step': 40})
  now.wait()
  assert now.held() == {20: str(job / 'rank_1'), 40: str(job / 'rank_0')}
  neighbour = local_checkpoint.LocalCheckpoints(str(job / 'rank_2'),
                                                every=20,
                                                attempt='a2')
  neighbour.save(40, _state(), {'step': 40})
  neighbour.wait()
  # A successful end: this process's copies and the directory a1's
  # numbering left go; the neighbour of this attempt removes its own.
  now.remove()
  assert sorted(p.name for p in job.iterdir()) == ['rank_2']
  neighbour.remove()
  assert not job.exists()


def test_nothing_is_made_on_disk_before_the_first_save(tmp_path):
  # A run refused before step 1 (or one that never saves) leaves no empty
  # directory in /dev/shm; the first save makes them, owner.json included.
  job = tmp_path / 'job'
  local = local_checkpoint.LocalCheckpoints(str(job / 'rank_0'),
                                            every=20,
                                            attempt='a1',
                                            owner='/runs/a/checkpoints')
  assert local.steps() == [] and local.held() == {}
  local.remove()
  assert not job.exists()
  local.save(20, _state(), {'step': 20})
  local.wait()
  assert sorted(p.name for p in job.iterdir()) == ['owner.json', 'rank_0']
  assert local.steps() == [20]


def test_the_job_id_lives_beside_the_persistent_checkpoints(tmp_path):
  first = local_checkpoint.job_id(str(tmp_path))
  assert local_checkpoint.job_id(str(tmp_path)) == first
  os.remove(tmp_path / local_checkpoint.JOB_ID_FILE)
  assert local_checkpoint.job_id(str(tmp_path)) != first


def _trajectory(config):
  return checkpoint_options.trajectory_config(config)


def test_a_copy_from_another_config_is_refused_naming_the_field(tmp_path):
  config = linear_regression_config.get_config()
  state = _state()
  local = local_checkpoint.LocalCheckpoints(str(tmp_path), every=20)
  local.save(40, state, _meta(config, state))
  local.wait()
  assert recovery.check_local(local, _trajectory(config), state, 100) == [40]
  config.optimizer.learning_rate = 0.5
  with pytest.raises(checkpoint.CheckpointError) as error:
    recovery.check_local(local, _trajectory(config), state, 100)
  assert 'config.optimizer.learning_rate' in str(error.value)
  assert 'this run 0.5' in str(error.value)
  with pytest.raises(checkpoint.CheckpointError, match='100 training'):
    config.optimizer.learning_rate = linear_regression_config.get_config(
    ).optimizer.learning_rate
    recovery.check_local(local, _trajectory(config), state, 99)


def _copies_of_20_and_40(tmp_path):
  """(config, state, local tier) with copies of steps 20 and 40."""
  config = linear_regression_config.get_config()
  state = _state()
  local = local_checkpoint.LocalCheckpoints(str(tmp_path), every=20)
  for step in (20, 40):
    local.save(step, state, _meta(config, state, step))
  local.wait()
  return config, state, local


@pytest.mark.parametrize('damage', ['truncated', 'removed', 'meta'])
def test_a_damaged_copy_is_removed_and_not_offered(damage, tmp_path):
  """Found by the soak: a truncated state.npz ended the next attempt with
  exit 1 (BadZipFile) instead of restoring from another copy."""
  config, state, local = _copies_of_20_and_40(tmp_path)
  npz = tmp_path / 'step_40' / 'state.npz'
  if damage == 'truncated':
    with open(npz, 'r+b') as f:
      f.truncate(npz.stat().st_size // 2)
  elif damage == 'removed':
    npz.unlink()
  else:
    (tmp_path / 'step_40' / 'meta.json').write_text('{"step": 4')
  assert recovery.check_local(local, _trajectory(config), state, 100) == [20]
  assert not (tmp_path / 'step_40').exists()
  assert local.unreadable(20, state) is None


def test_a_copy_garbled_inside_falls_back_to_the_one_before(tmp_path):
  """A copy whose zip directory reads but whose array does not (its
  checksum) is set aside during the restore, which plans again."""
  config, state, local = _copies_of_20_and_40(tmp_path)
  npz = tmp_path / 'step_40' / 'state.npz'
  raw = bytearray(npz.read_bytes())
  at = raw.index(b'\x00\x00\xc0\x3f')  # w[0] = 1.5, little-endian
  raw[at + 3] ^= 0x01
  npz.write_bytes(bytes(raw))
  assert local.unreadable(40, state) is None  # The zip's directory reads.
  options = types.SimpleNamespace(restore=True, trajectory=_trajectory(config))
  empty = types.SimpleNamespace(latest_step=lambda: None)  # No persistent.
  step, restored, tier = recovery.restore(options, empty, local, state, 100)
  assert (step, tier) == (20, 'local')
  _assert_same_bits(restored, state)
  assert local.steps() == [20]


@pytest.mark.parametrize('local_steps, persistent, expected', [
    ({
        0: [],
        1: []
    }, None, recovery.Plan(None, 'fresh')),
    ({
        0: [],
        1: []
    }, 100, recovery.Plan(100, 'persistent')),
    ({
        0: [20, 40],
        1: [20, 40]
    }, None, recovery.Plan(40, 'local', holders=(0, 1))),
    ({
        0: [20, 40],
        1: []
    }, 0, recovery.Plan(40, 'peer', 0, (0,))),
    ({
        0: [20],
        1: [20, 40],
        2: [40]
    }, 20, recovery.Plan(40, 'peer', 1, (1, 2))),
    ({
        0: [20, 40],
        1: [20, 40]
    }, 60, recovery.Plan(60, 'persistent')),
    ({
        0: [40],
        1: [40]
    }, 40, recovery.Plan(40, 'local', holders=(0, 1))),
])
def test_the_plan_takes_the_newest_step_anywhere(local_steps, persistent,
                                                 expected):
  assert recovery.plan(local_steps, persistent) == expected


def test_the_broadcast_payload_keeps_every_bit():
  state = _state()
  words = recovery.to_words(state)
  assert words.dtype == np.uint32
  _assert_same_bits(recovery.from_words(words, state), state)


def test_a_copy_is_read_from_its_mapped_file_with_its_crcs(tmp_path):
  arrays = {
      "['params']['w']": np.arange(12, dtype=np.float32).reshape(3, 4),
      "['rng']": np.array([1, 2], np.uint32),
      "['flag']": np.array(True),
      "['fortran']": np.asfortranarray(np.ones((2, 3), np.int16))
  }
  path = str(tmp_path / 'state.npz')
  np.savez(path, **arrays)
  read = local_checkpoint.read_npz(path)
  assert set(read) == set(arrays)
  for name, array in arrays.items():
    np.testing.assert_array_equal(read[name], array)
    assert read[name].dtype == array.dtype and not read[name].flags.writeable
  # A byte flipped inside an array fails its member's CRC.
  data = bytearray(open(path, 'rb').read())
  at = data.index(np.arange(12, dtype=np.float32).tobytes()) + 5
  data[at] ^= 0xFF
  open(path, 'wb').write(bytes(data))
  with pytest.raises(local_checkpoint.UNREADABLE, match='bad CRC'):
    local_checkpoint.read_npz(path)
  # A compressed .npz is not one of ours.
  np.savez_compressed(path, **arrays)
  with pytest.raises(local_checkpoint.UNREADABLE, match='compressed'):
    local_checkpoint.read_npz(path)


def test_a_too_small_dev_shm_sends_the_copies_to_the_temporary_directory(
    tmp_path, caplog, monkeypatch):
  monkeypatch.delenv('PODRUN_LOCAL_CHECKPOINT_DIR', raising=False)
  shm = tmp_path / 'shm'
  shm.mkdir()
  # Room enough: shared memory.
  assert local_checkpoint.default_root(1, shm=str(shm)).startswith(str(shm))
  # A container's 64 MB against copies it cannot hold: the temporary
  # directory, said with the two fixes.
  with caplog.at_level('WARNING'):
    root = local_checkpoint.default_root(10**18, shm=str(shm))
  assert not root.startswith(str(shm))
  assert 'podrun-local-' in root
  assert 'docker run --shm-size=' in caplog.text
  assert 'medium: Memory' in caplog.text
