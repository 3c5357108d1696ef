"""The workdir lease in a bucket, every change conditional on its
generation (launcher/process/lease_object.py), against fake-gcs-server behind
a layer that enforces `ifGenerationMatch` as Cloud Storage does (the
emulator ignores it on a delete: without the layer, two takers of one stale
lease both won 4 times in 15)."""

import json
import threading
import time

import pytest

from launcher.process import lease as lease_lib
from launcher.process import lease_object
from runtime.common import layout
from tests import gcs as gcs_lib

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]

ROUNDS = 20


@pytest.fixture(scope='module')
def bucket(tmp_path_factory):
  """gs://leases behind the precondition layer; gcsfs pointed at it."""
  with gcs_lib.FakeGcs(tmp_path_factory.mktemp('gcs')) as server:
    server.bucket('leases')
    with gcs_lib.SlowProxy(server.url, enforce_preconditions=True) as layer:
      patch = pytest.MonkeyPatch()
      for key, value in {**server.env(), **layer.env()}.items():
        patch.setenv(key, value)
      import gcsfs  # pylint: disable=g-import-not-at-top
      gcsfs.GCSFileSystem.clear_instance_cache()
      yield layer
      patch.undo()
      gcsfs.GCSFileSystem.clear_instance_cache()


def _stale(job_id='gone') -> bytes:
  return json.dumps({
      'job_id': job_id,
      'host': 'elsewhere',
      'pid': 1,
      'since': 0.0,
      'renewed': time.time() - 600,
      'token': 'old'
  }).encode()


def _holder(url: str) -> dict:
  return lease_object.read(url)[0]


def test_of_two_takers_of_a_stale_lease_exactly_one_wins(bucket):
  for round_ in range(ROUNDS):
    directory = f'gs://leases/race{round_}'
    url = f'{directory}/{layout.LEASE}'
    lease_object.create(url, _stale())
    start = threading.Barrier(2)
    won, refused = [], []

    def take(name):
      lease = lease_lib.Lease([directory], name, stale_after_s=60)
      start.wait()
      try:
        lease.acquire()
        won.append(lease)
      except lease_lib.WorkdirBusyError as e:
        refused.append(str(e))

    takers = [
        threading.Thread(target=take, args=(f'taker-{i}',)) for i in (1, 2)
    ]
    for t in takers:
      t.start()
    try:
      for t in takers:
        t.join(60)
      assert len(won) == 1 and len(refused) == 1, (round_, won, refused)
      assert _holder(url)['token'] == won[0].holder.token
      # Refused as it lost the race, or, later, as it found the winner's.
      assert ('at the same moment' in refused[0] or
              'is in use by job taker-' in refused[0]), refused
    finally:
      for lease in won:  # No renewal outlives the test.
        lease.release()
    assert lease_object.read(url) is None


def test_a_renewal_never_overwrites_a_taker_and_a_release_spares_it(bucket):
  directory = 'gs://leases/renewal'
  url = f'{directory}/{layout.LEASE}'
  lost = []
  lease = lease_lib.Lease([directory],
                          'job-a',
                          renew_every_s=0.2,
                          on_lost=lost.append)
  lease.acquire()
  try:
    _, generation = lease_object.read(url)
    # Another job takes over (as a taker of a stale lease would).
    assert lease_object.delete(url, generation)
    lease_object.create(url, _stale('job-b').replace(b'"old"', b'"b"'))
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
      time.sleep(0.05)
    assert lost and 'lost the lease on gs://leases/renewal to job job-b' in (
        lost[0]), lost
    assert _holder(url)['job_id'] == 'job-b'  # Not overwritten.
  finally:
    lease.release()
  assert _holder(url)['job_id'] == 'job-b'  # Not deleted either.


def test_a_release_deletes_only_the_generation_it_wrote(bucket):
  directory = 'gs://leases/release'
  url = f'{directory}/{layout.LEASE}'
  lease = lease_lib.Lease([directory], 'job-a', renew_every_s=60)
  lease.acquire()
  _, generation = lease_object.read(url)
  lease_object.replace(url, _stale('job-c'), generation)  # Written since.
  lease.release()
  assert _holder(url)['job_id'] == 'job-c'


def test_an_unreadable_lease_is_refused_not_taken(bucket):
  for name, content in (('garbage', b'not json {'), ('foreign',
                                                     b'{"owner": "someone"}')):
    directory = f'gs://leases/{name}'
    url = f'{directory}/{layout.LEASE}'
    lease_object.create(url, content)
    with pytest.raises(lease_lib.WorkdirBusyError,
                       match='this job stops without touching it'):
      lease_lib.Lease([directory], 'job-a').acquire()
    assert _bytes(url) == content  # Still there, untouched.


def _bytes(url: str) -> bytes:
  import gcsfs  # pylint: disable=g-import-not-at-top
  return gcsfs.GCSFileSystem().cat_file(url)
