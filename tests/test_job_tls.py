"""A job's certificate authority and each process's certificate
(launcher/common/job_tls.py), the launcher's mode (launcher/tls.py), and a
process's check of its coordinator (launcher/process/credentials.py), against
a TLS server of the test's own."""

import itertools
import os
import re
import socket
import ssl
import stat
import threading

from absl import logging
import pytest

from launcher import tls
from launcher.process import credentials
from runtime.common import handoff
from runtime.common import exit_codes
from launcher.common import job_tls

pytestmark = pytest.mark.unit


def _mode(path) -> int:
  return stat.S_IMODE(os.stat(path).st_mode)


def test_an_authority_and_a_certificate_are_private_and_name_the_attempt(
    tmp_path):
  authority = tmp_path / 'tls'
  job_tls.make_authority(str(authority), job='run7')
  assert job_tls.has_authority(str(authority))
  assert _mode(authority) == 0o700
  assert _mode(authority / job_tls.CA_KEY) == 0o600
  issued = job_tls.issue(str(authority), 'run7', 'run7-a2', 3,
                         str(tmp_path / 'mine'))
  assert issued.uri == 'podrun://run7/run7-a2/process/3'
  assert issued.peer_prefix == 'podrun://run7/run7-a2/'
  for path in (issued.cert_file, issued.key_file, issued.ca_file):
    assert _mode(path) == 0o600, path
  with open(issued.cert_file, 'rb') as f:
    pem = f.read()
  assert job_tls.uris(ssl.PEM_cert_to_DER_cert(pem.decode())) == [issued.uri]
  assert job_tls.attempt_of(issued.uri) == 'run7-a2'
  assert issued.jax_kwargs()['verify_secure_credentials'] is True


def test_names_with_any_characters_make_one_segment_each():
  assert job_tls.peer_prefix('my job/1', 'a?1') == 'podrun://my_job_1/a_1/'
  # The prefix ends with '/': attempt a1 does not accept a10.
  assert not 'podrun://j/a10/process/0'.startswith(
      job_tls.peer_prefix('j', 'a1'))


@pytest.mark.parametrize('version,has', [('0.10.2', False), ('0.11.1', False),
                                         ('0.12.0', True), ('0.12.0.1', True),
                                         ('0.13.0rc1', True), ('1.0', True),
                                         ('', False)])
def test_which_jax_has_mutual_tls(version, has):
  assert job_tls.supported(version) == has


def test_a_missing_authority_is_named(tmp_path):
  with pytest.raises(job_tls.TlsError, match='cannot read the job'):
    job_tls.issue(str(tmp_path), 'j', 'a', 0, str(tmp_path / 'out'))


def test_the_local_pod_makes_its_authority_where_jax_has_tls(tmp_path):
  said = []
  old = tls.PodAuthority(tls.AUTO, 'j', said.append, version='0.10.2')
  assert old.directory is None and old.process_args() == ['--tls=off']
  assert len(said) == 1 and 'JAX 0.10.2 has no mutual TLS' in said[0]
  new = tls.PodAuthority(tls.AUTO, 'j', said.append, version='0.12.0')
  try:
    assert job_tls.has_authority(new.directory)
    assert new.process_args() == ['--tls=require', f'--tls_dir={new.directory}']
  finally:
    new.close()
  assert not os.path.exists(new.directory or 'gone') and len(said) == 1
  off = tls.PodAuthority(tls.OFF, 'j', said.append, version='0.12.0')
  assert off.process_args() == ['--tls=off'] and len(said) == 1


def test_require_on_an_old_jax_is_refused_naming_the_version():
  with pytest.raises(exit_codes.ConfigError,
                     match=r'--tls=require: the installed JAX 0\.11\.1 has '
                     r'no mutual TLS.*0\.12 or newer'):
    tls.check_required(tls.REQUIRE, '0.11.1')
  tls.check_required(tls.AUTO, '0.11.1')
  tls.check_required(tls.REQUIRE, '0.12.0')


def test_podrun_tls_makes_an_authority_once(tmp_path, capsys):
  directory = str(tmp_path / 'tls')
  assert tls.main([directory, '--job', 'run7']) == 0
  assert f'--tls_dir={directory}' in capsys.readouterr().out
  with open(os.path.join(directory, job_tls.CA_CERT), 'rb') as f:
    first = f.read()
  assert tls.main([directory]) == exit_codes.CONFIG_ERROR
  assert 'already holds an authority' in capsys.readouterr().err
  assert tls.main([directory, '--force']) == 0
  with open(os.path.join(directory, job_tls.CA_CERT), 'rb') as f:
    assert f.read() != first


def test_a_process_joins_without_tls_only_when_told(tmp_path, monkeypatch):
  warned = []
  monkeypatch.setattr(logging, 'warning',
                      lambda *a: warned.append(a[0] % a[1:]))
  assert credentials.issue_for('off', None, 0, '0.12.0') is None
  assert credentials.issue_for('auto', None, 0, '0.12.0') is None
  assert 'no --tls_dir' in warned[-1] and 'podrun-tls DIR' in warned[-1]
  assert credentials.issue_for('auto', None, 1, '0.10.2') is None
  assert len(warned) == 1  # Process 0 says it, once.
  for version, why in (('0.10.2', 'JAX 0.10.2 has no mutual TLS'),
                       ('0.12.0', 'no --tls_dir')):
    with pytest.raises(exit_codes.ConfigError, match=why):
      credentials.issue_for('require', None, 0, version)
  authority = tmp_path / 'tls'
  job_tls.make_authority(str(authority), 'j')
  env = {handoff.JOB_ID: 'j', handoff.ATTEMPT: 'j-a3'}
  issued = credentials.issue_for('auto', str(authority), 2, '0.12.0', env)
  assert issued.uri == 'podrun://j/j-a3/process/2'
  # Beside the authority, so that the local pod's cleanup takes it too.
  assert issued.cert_file.startswith(str(authority / 'issued'))
  # A SLURM requeue is another attempt.
  requeued = credentials.issue_for('auto', str(authority), 0, '0.12.0', {
      'SLURM_JOB_ID': '77',
      'SLURM_RESTART_COUNT': '1'
  })
  assert requeued.uri == 'podrun://slurm-77/slurm-77-r1/process/0'


class _Server:
  """A TLS server on 127.0.0.1 that presents `issued`'s certificate, or a
  plain one (`plain=True`); with `plain_first=n`, plain for the first n
  connections, as another program holding the port before the coordinator
  takes it."""

  def __init__(self, issued=None, plain=False, plain_first=0):
    self.socket = socket.create_server(('127.0.0.1', 0))
    self.port = self.socket.getsockname()[1]
    self.plain_first = float('inf') if plain else plain_first
    self.context = None
    if not plain:
      self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
      self.context.load_cert_chain(issued.cert_file, issued.key_file)
      self.context.load_verify_locations(issued.ca_file)
      self.context.verify_mode = ssl.CERT_OPTIONAL
      self.context.set_alpn_protocols(['h2'])
    self.thread = threading.Thread(target=self._serve, daemon=True)
    self.thread.start()

  def _serve(self):
    for served in itertools.count():
      try:
        connection, _ = self.socket.accept()
      except OSError:
        return  # Closed.
      with connection:
        try:
          if served < self.plain_first:
            connection.recv(1024)
            connection.sendall(b'HTTP/1.1 400 Bad Request\r\n\r\n')
          else:
            with self.context.wrap_socket(connection, server_side=True) as t:
              t.recv(1)
        except (OSError, ssl.SSLError):
          pass

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.socket.close()
    self.thread.join(5)


def _issued(tmp_path, authority: str, attempt: str, index: int):
  path = tmp_path / authority
  if not job_tls.has_authority(str(path)):
    job_tls.make_authority(str(path), 'j')
  return job_tls.issue(str(path), 'j', attempt, index,
                       str(tmp_path / f'{authority}-{attempt}-{index}'))


def test_the_coordinator_of_this_attempt_is_accepted(tmp_path):
  with _Server(_issued(tmp_path, 'ca', 'j-a2', 0)) as server:
    credentials.check_coordinator('127.0.0.1', server.port,
                                  _issued(tmp_path, 'ca', 'j-a2', 1), 5)


@pytest.mark.parametrize('server_authority,server_attempt,plain,error', [
    ('ca', 'j-a1', False,
     'runs attempt j-a1, and this process belongs to attempt j-a2'),
    ('other', 'j-a2', False, 'is not this job\'s'),
    ('ca', 'j-a2', True, 'does not speak TLS'),
])
def test_a_coordinator_of_another_attempt_or_job_or_without_tls_is_named(
    tmp_path, server_authority, server_attempt, plain, error):
  mine = _issued(tmp_path, 'ca', 'j-a2', 1)
  theirs = _issued(tmp_path, server_authority, server_attempt, 0)
  with _Server(theirs, plain=plain) as server:
    with pytest.raises(credentials.TlsError, match=error):
      credentials.check_coordinator('127.0.0.1', server.port, mine, 5)


def test_a_program_holding_the_port_until_the_coordinator_takes_it(tmp_path):
  # Process 0 waits for its port while another program holds it: the
  # others ask again instead of blaming the coordinator's TLS.
  mine = _issued(tmp_path, 'ca', 'j-a2', 1)
  with _Server(_issued(tmp_path, 'ca', 'j-a2', 0), plain_first=2) as server:
    credentials.check_coordinator('127.0.0.1', server.port, mine, 5, wait_s=10)
  with _Server(plain=True) as server:
    with pytest.raises(credentials.TlsError,
                       match='or another program holds that port.*'
                       'answered so for 1 s'):
      credentials.check_coordinator('127.0.0.1', server.port, mine, 5, wait_s=1)


def test_nothing_listening_is_left_to_jax(tmp_path):
  mine = _issued(tmp_path, 'ca', 'j-a2', 1)
  # Nothing listening: JAX's own wait reports it, not this check.
  free = socket.create_server(('127.0.0.1', 0))
  port = free.getsockname()[1]
  free.close()
  credentials.check_coordinator('127.0.0.1', port, mine, 1)


def test_require_is_judged_on_the_installed_jax():
  # The oldest pair (JAX 0.10.2) refuses, naming its version; the newest
  # (0.12) starts.
  version = tls.jax_version()
  if job_tls.supported(version):
    tls.check_required(tls.REQUIRE)
  else:
    with pytest.raises(exit_codes.ConfigError,
                       match=f'the installed JAX {re.escape(version)} has no '
                       'mutual TLS'):
      tls.check_required(tls.REQUIRE)
