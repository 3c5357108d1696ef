"""Reading and writing IDX files, the format the MNIST files come in.

An IDX file is a 4-byte magic number (two zero bytes, a type code, the number
of dims), one big-endian uint32 per dim, then the data, row-major. MNIST uses
type 0x08 (unsigned bytes): images (n, 28, 28) and labels (n,). Files may be
gzipped; a name ending in .gz or the gzip magic bytes says so. A path may be
local or a gs:// object (read through etils' epath: the gcs extra), so that
every host of a job reads the same files from a bucket.
"""

import gzip
import os
from typing import Any

import numpy as np

import runtime

_TYPES: dict[int, Any] = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8')
}
_CODES = {
    np.dtype(v).newbyteorder('>') if np.dtype(v).itemsize > 1 else np.dtype(v):
        k for k, v in _TYPES.items()
}
_GZIP_MAGIC = b'\x1f\x8b'


class IdxError(runtime.ConfigError):
  """A missing or malformed IDX file; the message names the file."""


def _bucket_path(path: str):
  """epath's Path for a gs:// path (gcsfs behind it)."""
  try:
    from etils import epath  # pylint: disable=g-import-not-at-top
    import gcsfs  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise IdxError(f'{path}: a bucket needs gcsfs, which is not installed: '
                   "pip install -e '.[gcs]' (or \"podrun[gcs]\")") from e
  return epath.Path(path)


def check_bucket_access(path: str) -> None:
  """Refuses a gs:// path before any work where gcsfs is missing.

  Raises:
    IdxError: naming the extra to install.
  """
  _bucket_path(path)


def exists(path: str) -> bool:
  """Whether the file (local, or a gs:// object) exists."""
  if path.startswith('gs://'):
    return _bucket_path(path).exists()
  return os.path.exists(path)


def open_for_writing(path: str):
  """A binary file to write (local, or a gs:// object)."""
  if path.startswith('gs://'):
    return _bucket_path(path).open('wb')
  return open(path, 'wb')


def _read_bytes(path: str) -> bytes:
  if not exists(path):
    raise IdxError(f'{path}: no such file')
  if path.startswith('gs://'):
    raw = _bucket_path(path).read_bytes()
  else:
    with open(path, 'rb') as f:
      raw = f.read()
  if raw[:2] == _GZIP_MAGIC:
    try:
      return gzip.decompress(raw)
    except (OSError, EOFError) as e:
      raise IdxError(f'{path}: a broken gzip file ({e})') from None
  return raw


def read(path: str) -> np.ndarray:
  """Reads an IDX file (gzipped or not) into an array of its shape and type.

  Raises:
    IdxError: naming the file and what is wrong: missing, bad magic number,
      unknown type code, truncated or with bytes to spare.

  Example:
    >>> read('train-labels-idx1-ubyte.gz').shape
    (60000,)
  """
  raw = _read_bytes(path)
  if len(raw) < 4:
    raise IdxError(f'{path}: {len(raw)} bytes, too short for an IDX header')
  if raw[0] != 0 or raw[1] != 0 or raw[2] not in _TYPES:
    raise IdxError(f'{path}: bad magic number 0x{raw[:4].hex()}; an IDX file '
                   'starts with 0x0000, a type code (0x08 for bytes) and the '
                   'number of dims')
  dtype = np.dtype(_TYPES[raw[2]])
  ndim = raw[3]
  header = 4 + 4 * ndim
  if len(raw) < header:
    raise IdxError(f'{path}: truncated header: {ndim} dims need {header} '
                   f'bytes, the file has {len(raw)}')
  shape = tuple(int(d) for d in np.frombuffer(raw[4:header], '>u4'))
  expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(raw) != expected:
    what = 'truncated' if len(raw) < expected else 'longer than its header says'
    raise IdxError(f'{path}: {what}: shape {shape} of {dtype} needs '
                   f'{expected} bytes, the file has {len(raw)}')
  data = np.frombuffer(raw, dtype, offset=header).reshape(shape)
  return data.astype(dtype.newbyteorder('='))


def write(path: str, array: np.ndarray) -> None:
  """Writes `array` as an IDX file, gzipped when `path` ends in .gz.

  Example:
    >>> write('/tmp/t10k-labels-idx1-ubyte', np.zeros(10, np.uint8))
  """
  array = np.asarray(array)
  dtype = array.dtype.newbyteorder('>') if array.dtype.itemsize > 1 else (
      array.dtype)
  if dtype not in _CODES:
    raise ValueError(f'IDX has no type code for {array.dtype}')
  header = bytes([0, 0, _CODES[dtype], array.ndim]) + np.asarray(
      array.shape, '>u4').tobytes()
  payload = header + array.astype(dtype).tobytes()
  if path.endswith('.gz'):
    payload = gzip.compress(payload)
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  with open(path, 'wb') as f:
    f.write(payload)
