"""Draws a run's loss (and accuracy, where logged) against the step into a PNG.

  python scripts/plot_metrics.py WORKDIR [--out=WORKDIR/metrics.png]
  python scripts/plot_metrics.py gs://BUCKET/RUN [--out=metrics.png]

Reads WORKDIR/metrics.jsonl, the file process 0 writes while training: one
panel for the losses (training loss, and eval_loss where the run evaluated),
one for the accuracies when there are any. Training curves are the means over
each log window; evaluation points are marked. A gs:// workdir is read from
the bucket (every attempt's records; launcher/common/record_mirror.py).
"""

import argparse
import json
import os
import sys
import tempfile

import matplotlib

matplotlib.use('Agg')  # Files only: no display needed.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launcher.common import record_mirror  # pylint: disable=g-import-not-at-top,wrong-import-position
from runtime.common import layout  # pylint: disable=g-import-not-at-top,wrong-import-position


def read_records(workdir: str) -> list[dict]:
  """The records of WORKDIR/metrics.jsonl, in file order."""
  if layout.in_bucket(workdir):
    workdir = record_mirror.fetch_record(
        workdir, tempfile.mkdtemp(prefix='podrun-record-'))
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    raise FileNotFoundError(f'{path}: no such file; is {workdir} the --workdir '
                            'of a training run?')
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of the records that hold `key`."""
  points = [(r['step'], r[key]) for r in records if key in r]
  return [s for s, _ in points], [v for _, v in points]


def plot(records: list[dict], out: str, title: str) -> list[str]:
  """Writes the PNG; returns the names of the curves drawn."""
  panels = [('loss', ['loss', 'eval_loss'])]
  if any('accuracy' in r or 'eval_accuracy' in r for r in records):
    panels.append(('accuracy', ['accuracy', 'eval_accuracy']))
  fig, axes = plt.subplots(len(panels),
                           1,
                           figsize=(7, 3.2 * len(panels)),
                           sharex=True,
                           squeeze=False)
  drawn = []
  for ax, (label, keys) in zip(axes[:, 0], panels):
    for key in keys:
      steps, values = series(records, key)
      if not steps:
        continue
      is_eval = key.startswith('eval_')
      ax.plot(steps,
              values,
              marker='o' if is_eval else None,
              linestyle='--' if is_eval else '-',
              label='eval' if is_eval else 'train')
      drawn.append(key)
    ax.set_ylabel(label)
    if label == 'loss' and all(
        v > 0 for k in keys for v in series(records, k)[1]):
      ax.set_yscale('log')
    ax.grid(True, alpha=0.3)
    ax.legend()
  if not drawn:
    raise ValueError('metrics.jsonl holds no loss or accuracy to plot')
  axes[-1, 0].set_xlabel('step')
  axes[0, 0].set_title(title)
  fig.tight_layout()
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return drawn


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('workdir')
  parser.add_argument('--out', help='default: WORKDIR/metrics.png')
  args = parser.parse_args(argv)
  out = args.out or ('metrics.png' if layout.in_bucket(args.workdir) else
                     os.path.join(args.workdir, 'metrics.png'))
  try:
    drawn = plot(read_records(args.workdir), out,
                 os.path.basename(os.path.abspath(args.workdir)))
  except (OSError, ValueError) as e:
    print(f'plot_metrics: error: {e}', file=sys.stderr)
    return 2
  print(f'wrote {out} ({", ".join(drawn)})')
  return 0


if __name__ == '__main__':
  sys.exit(main())
