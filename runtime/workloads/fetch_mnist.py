"""Fetches the four MNIST IDX files (gzipped) into a directory or a bucket,
for users with internet access; the job itself never downloads anything.

  podrun-fetch-mnist [--data_dir=data/mnist] [--mirror=URL]
  podrun-fetch-mnist --data_dir=gs://BUCKET/mnist   # gcs extra

(`python scripts/fetch_mnist.py ...` in a checkout runs the same.)

Each file is checked after download: it must parse as IDX with the shape
MNIST has (60,000 or 10,000 images of 28 x 28, as many labels). A gs://
data_dir is what a job on several hosts reads (--config.data_dir=gs://...):
the files go through this machine, then to the bucket.
"""

import argparse
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request

import runtime
from runtime.workloads import idx
from runtime.workloads import mnist

MIRROR = 'https://storage.googleapis.com/cvdf-datasets/mnist/'
SHAPES = {
    'train_images': (60000, 28, 28),
    'train_labels': (60000,),
    'test_images': (10000, 28, 28),
    'test_labels': (10000,)
}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--data_dir', default='data/mnist')
  parser.add_argument('--mirror', default=MIRROR)
  args = parser.parse_args()
  if args.data_dir.startswith('gs://'):
    idx.check_bucket_access(args.data_dir)  # Before the download.
    with tempfile.TemporaryDirectory(prefix='mnist_') as local:
      fetch(local, args.mirror)
      upload(local, args.data_dir)
  else:
    fetch(args.data_dir, args.mirror)


def fetch(data_dir: str, mirror: str) -> None:
  """The four files into the local `data_dir`, each checked."""
  os.makedirs(data_dir, exist_ok=True)
  for key, name in mnist.FILES.items():
    path = os.path.join(data_dir, name + '.gz')
    if not os.path.exists(path):
      url = mirror.rstrip('/') + '/' + name + '.gz'
      print(f'fetching {url}')
      try:
        urllib.request.urlretrieve(url, path + '.part')
      except (urllib.error.URLError, OSError) as e:
        sys.exit(f'podrun-fetch-mnist: cannot fetch {url}: {e}. Offline: '
                 f'copy the four MNIST files ({", ".join(_names())}) into '
                 f'{data_dir} from a machine that has them, give '
                 '--mirror=URL of a mirror this machine reaches, or write '
                 "scikit-learn's digits as MNIST files (pip install -e "
                 "'.[digits]' && python scripts/digits_as_mnist.py "
                 '--data_dir=data/digits, then --config.data_dir=data/digits)')
      os.replace(path + '.part', path)
    shape = idx.read(path).shape
    if shape != SHAPES[key]:
      sys.exit(f'{path}: shape {shape}, MNIST has {SHAPES[key]}')
    print(f'{path}: {shape} ok')


def _names() -> list[str]:
  return [name + '.gz' for name in mnist.FILES.values()]


def upload(local: str, url: str) -> None:
  """Copies the checked files of `local` to gs://BUCKET/PREFIX, then reads
  each back from there."""
  for name in mnist.FILES.values():
    target = url.rstrip('/') + '/' + name + '.gz'
    with open(os.path.join(local, name + '.gz'), 'rb') as source, \
        idx.open_for_writing(target) as sink:
      shutil.copyfileobj(source, sink)
    print(f'{target}: {idx.read(target).shape} ok')


def run() -> None:
  """The console script `podrun-fetch-mnist`: a mistake is one line and
  its exit code, never a traceback."""
  try:
    main()
  except runtime.PodrunError as e:
    print(f'podrun-fetch-mnist: error: {e}', file=sys.stderr)
    sys.exit(e.exit_code)


if __name__ == '__main__':
  run()
