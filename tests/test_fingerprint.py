import numpy as np

import pytest

from runtime import fingerprint
from runtime import parallelism

pytestmark = pytest.mark.unit


def test_equal_trees_have_equal_fingerprints_on_device_or_host():
  tree = {
      'w': np.arange(6, dtype=np.float32).reshape(2, 3) - 2,
      'b': np.float32(1.5)
  }
  host = fingerprint.fingerprint(tree)
  replicated = fingerprint.fingerprint(parallelism.PMAP.replicate(tree))
  assert host == replicated
  assert host['abs_sum'] == 2 + 1 + 0 + 1 + 2 + 3 + 1.5
  assert host['num_params'] == 7


def test_any_change_changes_the_hash():
  tree = {'w': np.zeros(4, np.float32)}
  changed = {'w': np.array([0, 0, 0, 1e-30], np.float32)}
  renamed = {'v': np.zeros(4, np.float32)}
  hashes = {
      fingerprint.fingerprint(t)['sha256'] for t in (tree, changed, renamed)
  }
  assert len(hashes) == 3
