"""IDX files: round trips, and errors that name the file and the fault."""

import gzip
import sys

import numpy as np
import pytest

from runtime.workloads import idx
from runtime.workloads import mnist

pytestmark = pytest.mark.unit


@pytest.mark.parametrize('name', ['images-idx3-ubyte', 'images-idx3-ubyte.gz'])
def test_round_trip(tmp_path, name):
  array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
  idx.write(str(tmp_path / name), array)
  np.testing.assert_array_equal(idx.read(str(tmp_path / name)), array)


def test_round_trip_of_wider_types(tmp_path):
  array = np.array([[1.5, -2.0]], np.float32)
  idx.write(str(tmp_path / 'f'), array)
  read = idx.read(str(tmp_path / 'f'))
  assert read.dtype == np.float32
  np.testing.assert_array_equal(read, array)


def _raw(tmp_path, payload):
  path = tmp_path / 'bad-idx'
  path.write_bytes(payload)
  return str(path)


def test_missing_file(tmp_path):
  with pytest.raises(idx.IdxError, match='no such file'):
    idx.read(str(tmp_path / 'nothing'))


def test_bad_magic_number(tmp_path):
  path = _raw(tmp_path, b'\x12\x34\x08\x01' + b'\x00\x00\x00\x01' + b'\x05')
  with pytest.raises(idx.IdxError,
                     match=f'{path}: bad magic number '
                     '0x12340801'):
    idx.read(path)


def test_truncated_data(tmp_path):
  path = _raw(tmp_path,
              bytes([0, 0, 8, 1]) + (10).to_bytes(4, 'big') + b'\x00' * 7)
  with pytest.raises(idx.IdxError,
                     match=r'truncated: shape \(10,\) of uint8 '
                     'needs 18 bytes, the file has 15'):
    idx.read(path)


def test_truncated_header(tmp_path):
  path = _raw(tmp_path, bytes([0, 0, 8, 3]) + b'\x00\x00')
  with pytest.raises(idx.IdxError, match='truncated header: 3 dims need 16'):
    idx.read(path)


def test_extra_bytes(tmp_path):
  path = _raw(tmp_path,
              bytes([0, 0, 8, 1]) + (2).to_bytes(4, 'big') + b'\x00' * 3)
  with pytest.raises(idx.IdxError, match='longer than its header says'):
    idx.read(path)


def test_broken_gzip(tmp_path):
  payload = gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 1, 7]))[:-6]
  with pytest.raises(idx.IdxError, match='a broken gzip file'):
    idx.read(_raw(tmp_path, payload))


def test_mnist_loads_plain_or_gzipped_files(tmp_path):
  for gzipped in (True, False):
    data_dir = tmp_path / str(gzipped)
    written = mnist.write_synthetic(str(data_dir),
                                    num_train=64,
                                    num_test=33,
                                    gzipped=gzipped)
    data = mnist.load(str(data_dir))
    assert data['train_images'].shape == (64, 784)
    assert data['test_labels'].dtype == np.int32
    np.testing.assert_array_equal(data['test_labels'], written['test_labels'])
    np.testing.assert_allclose(data['train_images'],
                               written['train_images'].reshape(64, -1) / 255.0,
                               rtol=1e-7)


def test_mnist_names_a_missing_file_and_the_fetch_script(tmp_path):
  mnist.write_synthetic(str(tmp_path), num_train=8, num_test=8)
  (tmp_path / 't10k-labels-idx1-ubyte.gz').unlink()
  with pytest.raises(idx.IdxError,
                     match=r't10k-labels-idx1-ubyte\[.gz\]: no '
                     'such file.*podrun-fetch-mnist'):
    mnist.load(str(tmp_path))


def test_mnist_names_images_and_labels_that_disagree(tmp_path):
  mnist.write_synthetic(str(tmp_path), num_train=8, num_test=8)
  idx.write(str(tmp_path / 'train-labels-idx1-ubyte.gz'), np.zeros(7, np.uint8))
  with pytest.raises(idx.IdxError,
                     match='holds 8 images but .* holds 7 '
                     'labels'):
    mnist.load(str(tmp_path))


def test_a_fetch_into_a_bucket_without_gcsfs_is_one_line(monkeypatch, capsys):
  """podrun-fetch-mnist --data_dir=gs://...: the extra to install, before
  any download, and exit 2, not a traceback."""
  from runtime.workloads import fetch_mnist  # pylint: disable=g-import-not-at-top
  monkeypatch.setitem(sys.modules, 'gcsfs', None)  # As if not installed.
  monkeypatch.setattr(
      sys, 'argv', ['podrun-fetch-mnist', '--data_dir=gs://bucket/mnist-data'])
  monkeypatch.setattr(fetch_mnist, 'fetch', lambda *a: pytest.fail('fetched'))
  with pytest.raises(SystemExit) as ended:
    fetch_mnist.run()
  assert ended.value.code == 2
  said = capsys.readouterr().err
  assert said.startswith('podrun-fetch-mnist: error: gs://bucket/mnist-data: '
                         "a bucket needs gcsfs, which is not installed: pip "
                         "install -e '.[gcs]'"), said


def test_an_offline_fetch_is_one_line_with_the_ways_round(
    monkeypatch, tmp_path):
  """A mirror that cannot be reached (a closed port on 127.0.0.1): one line
  naming the URL and the three ways round it, not urllib's traceback."""
  import socket  # pylint: disable=g-import-not-at-top
  from runtime.workloads import fetch_mnist  # pylint: disable=g-import-not-at-top
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    port = probe.getsockname()[1]  # Closed when the block ends.
  monkeypatch.setattr(sys, 'argv', [
      'podrun-fetch-mnist', f'--data_dir={tmp_path}',
      f'--mirror=http://127.0.0.1:{port}/'
  ])
  with pytest.raises(SystemExit) as ended:
    fetch_mnist.run()
  said = str(ended.value.code)
  assert said.startswith(f'podrun-fetch-mnist: cannot fetch '
                         f'http://127.0.0.1:{port}/train-images'), said
  for way in ('copy the four MNIST files', '--mirror=URL',
              'scripts/digits_as_mnist.py'):
    assert way in said, said
  assert not list(tmp_path.glob('*.part')), 'a partial file was left'
