"""This process's part of mutual TLS on the coordination service: the
certificate it issues itself from the job's authority (--tls_dir), and a
handshake with the coordinator before it joins, which names a coordinator
of another job or of another attempt instead of letting JAX abort.

Example:
  >>> found = credentials.issue_for('require', '/tmp/podrun-tls-x', 1)
  >>> credentials.check_coordinator('10.0.0.2', 8476, found, timeout_s=10)
"""

import os
import socket
import ssl
import tempfile
import time
from typing import Mapping, Optional

from absl import logging

from runtime.common import handoff
from runtime.common import exit_codes
from launcher.common import job_tls


class TlsError(exit_codes.PodrunError, RuntimeError):
  """This process cannot join with the job's credentials; the message says
  why and what to change."""
  exit_code = exit_codes.DISTRIBUTED_INIT_FAILED


def _identity(env: Mapping[str, str]) -> tuple[str, str]:
  """(job, attempt) as the launcher named them, or SLURM (a requeued job
  is a new attempt); a job started by hand without them shares one
  identity on every attempt."""
  told = handoff.Handoff.read(env)
  if told.attempt is None and 'SLURM_JOB_ID' in env:
    job = f'slurm-{env["SLURM_JOB_ID"]}'
    return job, f'{job}-r{env.get("SLURM_RESTART_COUNT", "0")}'
  return told.job_id or 'job', told.attempt or 'attempt'


def issue_for(
    mode: str,
    tls_dir: Optional[str],
    process_index: Optional[int],
    jax_version: str,
    env: Mapping[str, str] = os.environ) -> Optional[job_tls.Credentials]:
  """This process's credentials, or None to join without TLS (said once,
  by process 0, where `auto` finds no authority or an old JAX).

  Raises:
    exit_codes.ConfigError: `require` without an authority or on an old JAX.
    TlsError: the authority cannot be read.
  """
  if mode == job_tls.OFF:
    return None
  speaks = job_tls.supported(jax_version)
  if mode == job_tls.REQUIRE and not (speaks and tls_dir):
    raise exit_codes.ConfigError(
        '--tls=require: ' + (f'JAX {jax_version} has no mutual TLS (0.12 '
                             'and newer have it)' if not speaks else
                             'no --tls_dir (make one with `podrun-tls DIR` '
                             'on a path every host reads)'))
  if not speaks or not tls_dir:
    if process_index in (0, None):
      logging.warning(
          'the coordinator runs without TLS (%s): any process that reaches '
          'its port can join this job or end it. %s',
          f'JAX {jax_version} has none' if not speaks else 'no --tls_dir',
          'Keep the port inside the job\'s network' if not speaks else
          'Make an authority with `podrun-tls DIR` and pass --tls_dir=DIR '
          'to every process, or say --tls=off (docs/trust.md)')
    return None
  job, attempt = _identity(env)
  index = process_index if process_index is not None else os.getpid()
  try:
    return job_tls.issue(tls_dir, job, attempt, index,
                         _issued_dir(tls_dir, attempt, index))
  except (job_tls.TlsError, OSError) as e:
    raise TlsError(str(e)) from e


def _issued_dir(tls_dir: str, attempt: str, index: int) -> str:
  """Where this process keeps its certificate: beside the authority, so
  that whoever removes the authority (the local pod, at its end) removes it
  too; a private temporary directory where the authority is read-only."""
  if os.access(tls_dir, os.W_OK):
    return os.path.join(tls_dir, 'issued',
                        f'{job_tls.uri_part(attempt)}-{index}')
  return tempfile.mkdtemp(prefix='podrun-credentials-')


class _Foreign(TlsError):
  """What answered at the coordinator's address is not a coordinator of this
  job: it may be another program holding the port while process 0 waits for
  it, so the handshake is tried again before this is raised."""


def _peer_certificate(host: str, port: int, found: job_tls.Credentials,
                      timeout_s: float) -> Optional[bytes]:
  """The coordinator's certificate (DER) from a handshake that presents
  ours; None when nothing answers (JAX's own wait then reports it)."""
  context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
  context.check_hostname = False  # The URI is checked instead, as JAX does.
  context.load_verify_locations(found.ca_file)
  context.load_cert_chain(found.cert_file, found.key_file)
  context.set_alpn_protocols(['h2'])  # gRPC's.
  try:
    with socket.create_connection((host, port), timeout=timeout_s) as raw:
      with context.wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True)
  except ssl.SSLCertVerificationError as e:
    raise _Foreign(
        f'the coordinator at {host}:{port} is not this job\'s: its '
        f'certificate is not signed by this job\'s authority ({e.reason}). '
        'Every process of a job needs the same --tls_dir; check that '
        '--coordinator_address names this job\'s process 0') from e
  except ssl.SSLError as e:
    raise _Foreign(
        f'the coordinator at {host}:{port} does not speak TLS ({e.reason}): '
        'its process runs with --tls=off or on a JAX older than 0.12, or '
        'another program holds that port. Every process of a job needs the '
        'same --tls and --tls_dir') from e
  except OSError:
    return None


def _answer(host: str, port: int, found: job_tls.Credentials, timeout_s: float,
            wait_s: float) -> Optional[bytes]:
  """`_peer_certificate`, tried again for up to `wait_s` seconds while what
  answers is foreign: process 0 waits that long for its port to be let go
  (`distributed.PORT_WAIT_S`), and until then another program answers."""
  deadline = time.monotonic() + wait_s
  warned = False
  while True:
    try:
      return _peer_certificate(host, port, found, timeout_s)
    except _Foreign as e:
      if time.monotonic() >= deadline:
        raise TlsError(f'{e}; it answered so for {wait_s:g} s') from e
      if not warned:
        logging.warning(
            '%s; asking again for up to %g s, in case process 0 '
            'is still waiting for its port', e, wait_s)
        warned = True
    time.sleep(0.5)


def check_coordinator(host: str,
                      port: int,
                      found: job_tls.Credentials,
                      timeout_s: float,
                      wait_s: float = 0.0) -> None:
  """Checks that the coordinator at HOST:PORT is this job's and this
  attempt's, before JAX's client, which aborts the process on a refused
  handshake without saying why. A listener that is no coordinator of this
  job is asked again for `wait_s` seconds.

  Raises:
    TlsError: naming the coordinator's attempt and this process's.
  """
  certificate = _answer(host, port, found, timeout_s, wait_s)
  if certificate is None:
    return
  names = job_tls.uris(certificate)
  if any(n.startswith(found.peer_prefix) for n in names):
    return
  theirs = next((job_tls.attempt_of(n) for n in names if job_tls.attempt_of(n)),
                None)
  raise TlsError(
      f'the coordinator at {host}:{port} runs attempt {theirs or names}, and '
      f'this process belongs to attempt {job_tls.attempt_of(found.uri)}: a '
      'process of one attempt never joins another\'s coordinator. This '
      'process stops; the launcher starts every process of the next attempt '
      'together')
