"""A short, comparable summary of a parameter pytree.

Two processes hold the same parameters exactly when their fingerprints' hashes
agree; `abs_sum` is a readable number to compare with a tolerance across runs
that differ in float rounding (for example 1x8 against 2x4 devices).
"""

import hashlib
from typing import Any, TypedDict

import jax
import numpy as np


class Fingerprint(TypedDict):
  """What `fingerprint` returns."""
  sha256: str  # of every leaf's path, dtype, shape and bytes
  abs_sum: float  # float64 sum of |x| over every element
  num_params: int  # total element count


def fingerprint(tree: Any) -> Fingerprint:
  """Fingerprints a pytree of arrays.

  Args:
    tree: replicated or host arrays; each leaf is read on this host.

  Returns:
    A Fingerprint: sha256, abs_sum and num_params.

  Example:
    >>> fingerprint({'w': np.ones(3, np.float32)})['abs_sum']
    3.0
  """
  digest = hashlib.sha256()
  abs_sum = 0.0
  count = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    x = np.ascontiguousarray(jax.device_get(leaf))
    digest.update(f'{jax.tree_util.keystr(path)}|{x.dtype}|{x.shape}|'.encode())
    digest.update(x.tobytes())
    abs_sum += float(np.abs(x.astype(np.float64)).sum())
    count += x.size
  return Fingerprint(sha256=digest.hexdigest(),
                     abs_sum=abs_sum,
                     num_params=count)
