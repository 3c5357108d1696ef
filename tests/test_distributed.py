import contextlib
import http.server
import socket
import threading
import time
from typing import Optional
from unittest import mock

import pytest

from launcher.process import distributed
from launcher.process import tpu_metadata
from launcher.common import cluster

pytestmark = pytest.mark.unit


def _options(**kwargs):
  return distributed.CoordinatorFlags(**kwargs)


def test_plan():
  assert distributed.plan(_options(), env={}).mode == distributed.SINGLE
  slurm = {
      'SLURM_JOB_ID': '1',
      'SLURM_STEP_NODELIST': 'n[1-2]',
      'SLURM_NTASKS': '2',
      'SLURM_PROCID': '0',
      'SLURM_LOCALID': '0'
  }
  assert distributed.plan(_options(), env=slurm) == distributed.Plan(
      distributed.DETECT, "SLURM's variables (inside srun)")
  explicit = _options(coordinator_address='10.0.0.1:1234',
                      num_processes=2,
                      process_id=1)
  assert distributed.plan(explicit, env=slurm).mode == distributed.EXPLICIT


@pytest.mark.parametrize('kwargs, message', [
    (dict(num_processes=2), '--num_processes=2 given without '
     '--coordinator_address and --process_id'),
    (dict(coordinator_address='h:1', num_processes=2,
          process_id=2), '--process_id=2 is outside [0, 2)'),
    (dict(coordinator_address='nohostport', num_processes=2,
          process_id=0), "'nohostport' is not HOST:PORT"),
])
def test_plan_refuses_inconsistent_flags(kwargs, message):
  with pytest.raises(distributed.DistributedInitError) as e:
    distributed.plan(_options(**kwargs), env={})
  assert message in str(e.value)


def test_split_address_handles_ipv6():
  assert distributed.split_address('[::1]:8476') == ('::1', 8476)
  assert distributed.split_address('10.0.0.2:8476') == ('10.0.0.2', 8476)


def test_proxy_warning_and_exemption():
  env = {'https_proxy': 'http://proxy:3128', 'no_proxy': 'example.com'}
  warnings = cluster.proxy_warnings('10.0.0.2', env)
  assert len(warnings) == 1 and 'https_proxy' in warnings[0]
  cluster.exempt_from_proxy(['10.0.0.2'], env)
  assert env['no_proxy'] == 'example.com,10.0.0.2'
  assert env['NO_PROXY'] == '10.0.0.2'
  assert cluster.proxy_warnings('10.0.0.2', env) == []
  assert cluster.proxy_warnings('10.0.0.2', {}) == []


@pytest.mark.parametrize(
    'env, name',
    [
        ({}, None),
        ({
            'SLURM_JOB_ID': '1',
            'SLURM_STEP_NODELIST': 'n1',
            'SLURM_NTASKS': '1',
            'SLURM_PROCID': '0',
            'SLURM_LOCALID': '0'
        }, 'slurm'),
        ({
            'SLURM_JOB_ID': '1'
        }, None),  # An allocation, but not inside srun.
        ({
            'OMPI_MCA_orte_hnp_uri': '1.0;tcp://10.0.0.1:1'
        }, 'open_mpi'),
        ({
            'TPU_WORKER_HOSTNAMES': 'a,b'
        }, 'gke_tpu'),
        ({
            'KUBERNETES_SERVICE_HOST': '10.0.0.1',
            'JOB_COMPLETION_INDEX': '3'
        }, 'kubernetes'),
        ({
            'KUBERNETES_SERVICE_HOST': '10.0.0.1'
        }, None),
    ])
def test_cluster_detection_reads_the_environment(env, name):
  assert cluster.detect(env) == name


def test_the_coordinator_listens_where_the_job_names_it():
  assert distributed.bind_address('127.0.0.1:8476') == (
      '127.0.0.1:8476', 'the address --coordinator_address names')
  assert distributed.bind_address('[::1]:8476')[0] in ('[::1]:8476', None)
  # Not this machine's: every interface, JAX's default, and why.
  bind, why = distributed.bind_address('192.0.2.7:8476')  # TEST-NET-1
  assert bind is None and why.startswith('192.0.2.7 is not an address of')


# A TPU host as it comes: libtpu installed, and a metadata server that says
# one worker, several, nothing, or is not there at all.


class _Metadata(http.server.BaseHTTPRequestHandler):
  """A TPU VM's metadata server on 127.0.0.1, saying `endpoints`."""
  endpoints: Optional[str] = None

  def do_GET(self):  # pylint: disable=invalid-name
    wanted = '/computeMetadata/v1/instance/attributes/worker-network-endpoints'
    if (self.path != wanted or self.endpoints is None or
        self.headers.get('Metadata-Flavor') != 'Google'):
      self.send_error(404)
      return
    body = self.endpoints.encode()
    self.send_response(200)
    self.send_header('Content-Length', str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, *args):
    pass


@contextlib.contextmanager
def _metadata_server(endpoints: Optional[str]):
  handler = type('Handler', (_Metadata,), {'endpoints': endpoints})
  server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f'127.0.0.1:{server.server_address[1]}'
  finally:
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def _silent_server():
  """A port that accepts connections (the kernel's backlog) and never
  answers them."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    s.listen(8)
    yield f'127.0.0.1:{s.getsockname()[1]}'


def _refusing_address() -> str:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return f'127.0.0.1:{s.getsockname()[1]}'


@pytest.fixture
def libtpu(tmp_path, monkeypatch):
  """An empty module named libtpu on the path, as a TPU image installs one."""
  (tmp_path / 'libtpu').mkdir()
  (tmp_path / 'libtpu' / '__init__.py').write_text('')
  monkeypatch.syspath_prepend(str(tmp_path))
  assert cluster.detect({}) == 'cloud_tpu_vm'


@pytest.mark.parametrize('endpoints, mode, words', [
    ('10.0.0.2', distributed.SINGLE, 'names one worker'),
    ('w-0:0:10.0.0.2', distributed.SINGLE, 'names one worker'),
    ('10.0.0.2,10.0.0.3', distributed.DETECT, 'names 2 workers'),
    (None, distributed.SINGLE, 'answered HTTP 404'),
])
def test_a_tpu_host_asks_its_metadata_server_how_many_workers(
    libtpu, endpoints, mode, words):
  with _metadata_server(endpoints) as where:
    chosen = distributed.plan(_options(), env={'GCE_METADATA_IP': where})
  assert chosen.mode == mode and words in chosen.why, chosen


def test_a_tpu_host_without_a_metadata_server_runs_alone(libtpu):
  where = _refusing_address()
  chosen = distributed.plan(_options(), env={'GCE_METADATA_IP': where})
  assert chosen == distributed.Plan(distributed.SINGLE, chosen.why,
                                    (('TPU_SKIP_MDS_QUERY', '1'),))
  assert f'libtpu is installed but {where} cannot be reached' in chosen.why
  assert 'ConnectionRefusedError' in chosen.why


def test_a_silent_metadata_server_is_waited_for_a_bounded_time(libtpu):
  with _silent_server() as where:
    started = time.monotonic()
    chosen = distributed.plan(_options(), env={'GCE_METADATA_IP': where})
    waited = time.monotonic() - started
  assert chosen.mode == distributed.SINGLE
  assert f'no answer from {where} within 2 s' in chosen.why, chosen.why
  assert waited < tpu_metadata.BOUND_S + 2, waited


def test_a_name_that_never_resolves_is_bounded_too(libtpu):

  def slow_lookup(*args, **kwargs):
    time.sleep(30)
    raise socket.gaierror('never reached')

  started = time.monotonic()
  with mock.patch.object(socket, 'getaddrinfo', slow_lookup):
    answer = tpu_metadata.workers({}, bound_s=0.5)
  assert time.monotonic() - started < 2
  assert answer == tpu_metadata.Answer(
      'metadata.google.internal', None,
      'no answer from metadata.google.internal within 0.5 s')


def test_what_decides_without_asking(libtpu):

  def never(env):
    raise AssertionError('the metadata server was asked')

  def plan(env, **options):
    return distributed.plan(_options(**options), env=env, ask=never)

  assert plan({}, cluster='none') == distributed.Plan(distributed.SINGLE,
                                                      '--cluster=none')
  assert plan({'TPU_SKIP_MDS_QUERY': '1'}).mode == distributed.SINGLE
  assert plan({'TPU_WORKER_HOSTNAMES': 'localhost'}) == distributed.Plan(
      distributed.SINGLE, 'TPU_WORKER_HOSTNAMES names one worker (localhost)')
  assert plan({'TPU_WORKER_HOSTNAMES': 'a,b'}).mode == distributed.DETECT
  assert plan({
      'MEGASCALE_COORDINATOR_ADDRESS': 'a:1'
  }).mode == (distributed.DETECT)


def test_cluster_none_with_the_coordinator_flags_is_refused():
  with pytest.raises(distributed.DistributedInitError,
                     match='--cluster=none runs one process alone'):
    distributed.plan(_options(coordinator_address='h:1',
                              num_processes=2,
                              process_id=0,
                              cluster='none'),
                     env={})
