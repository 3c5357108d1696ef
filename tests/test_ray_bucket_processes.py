"""A Ray job whose workdir is a bucket (fake-gcs-server on 127.0.0.1): the
driver completes the bucket's record after its last attempt, and no
process writes the launcher's files.

About 15 s: a Ray cluster of its own, since its raylets must start with
the emulator's environment, which the module cluster of
test_ray_processes.py lacks.
"""

import os

import pytest

from runtime.common import handoff
from tests import gcs as gcs_lib
from tests import helpers
from tests import ray_cluster  # Before Ray: it keeps Ray on 127.0.0.1.

pytest.importorskip('ray')

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

LINEAR = [
    '--config=configs/linear_regression.py', '--config.steps=30',
    '--local_devices=2'
]


def test_the_driver_writes_the_launchers_files_into_the_bucket(
    tmp_path, monkeypatch):
  cache = tmp_path / 'cache'
  with gcs_lib.FakeGcs(tmp_path) as gcs:
    gcs.bucket('runs')
    # The raylets, their processes and the driver all see the emulator and
    # keep their copy of the record under `cache`.
    for name, value in {**gcs.env(), handoff.RECORD_CACHE: str(cache)}.items():
      monkeypatch.setenv(name, value)
    url = 'gs://runs/ray'
    with ray_cluster.RayCluster(nodes=2) as cluster:
      result = ray_cluster.run_podrun_ray(cluster.address, 2,
                                          [*LINEAR, f'--workdir={url}'])
    assert result.returncode == 0, result.output
    assert 'cannot add the attempts' not in result.stderr, result.stderr
    assert 'goodput ' in result.stderr, result.stderr
    record = gcs.fetch_record(url, tmp_path / 'record')
  # The driver's: the roll-up over the one attempt, its attempts, job.json.
  lines = helpers.read_jsonl(record / 'goodput.jsonl')
  assert [line['attempt'] for line in lines] == [1], lines
  summary = helpers.read_json(record / 'summary.json')
  assert summary['goodput']['attempts'] == 1, summary
  assert summary['process_count'] == 2  # Process 0's, the rest of it.
  attempts = helpers.read_jsonl(record / 'logs' / 'attempts.jsonl')
  assert [a['kind'] for a in attempts] == ['ok'], attempts
  job = helpers.read_json(record / 'logs' / 'job.json')
  assert (job['launched_by'], job['exit_code'],
          len(job['ranks'])) == ('podrun-ray', 0, 2), job
  # This machine's copy of the record, which process 0 wrote into and
  # mirrored: its run.json, and no roll-up or summary.json there, the
  # driver's (in the bucket above), so process 0 wrote neither.
  copy = cache / 'runs' / 'ray'
  assert (copy / 'run.json').exists()
  assert not (copy / 'summary.json').exists()
  # The driver's logs stay in the copy: it was this job's before the
  # driver wrote there, so no process set it aside.
  assert not list(cache.glob('runs/ray.set-aside-*'))
  assert (copy / 'logs' / 'rank_1.log').stat().st_size > 0
  assert not (copy / 'goodput.jsonl').exists(), os.listdir(copy)
