"""A job's own certificate authority, and each process's certificate, for
mutual TLS on JAX's coordination service (JAX 0.12 and newer).

An authority is a directory (mode 0700) holding `ca.pem` and `ca.key`
(0600), made once a launch (`make_authority`). Each process issues itself a
certificate at its start (`issue`), whose one name is the URI
podrun://JOB/ATTEMPT/process/I, into a private temporary directory. JAX is
then told to accept a peer only when its certificate is signed by the
authority and its URI starts with podrun://JOB/ATTEMPT/: a process without
the authority's key, of another job, or of another attempt of this job is
refused at the handshake, before it can join or touch the key-value store.
Whoever can read the authority's directory can join: keep it where only the
job's user reads (the launcher's own temporary directory, a job directory
of mode 0700 on a shared file system).

Nothing here imports JAX; `cryptography` is imported when used.

Example:
  >>> make_authority('/run/user/1000/podrun-tls-x1', job='4f0c9a')
  >>> credentials = issue('/run/user/1000/podrun-tls-x1', job='4f0c9a',
  ...                     attempt='4f0c9a-a1', process_index=1, out_dir=tmp)
  >>> jax.distributed.initialize(..., **credentials.jax_kwargs())
"""

import dataclasses
import datetime
import os
import re
from typing import Optional

# --tls: use it where JAX has it, refuse to start without it, or not at all.
AUTO, REQUIRE, OFF = 'auto', 'require', 'off'
MODES = (AUTO, REQUIRE, OFF)

CA_CERT = 'ca.pem'
CA_KEY = 'ca.key'
# The first JAX whose jax.distributed.initialize takes mtls_* arguments.
MIN_JAX = (0, 12)
# How long an authority is valid: longer than any job's attempt runs.
VALID_DAYS = 30
_URI_UNSAFE = re.compile(r'[^A-Za-z0-9._~-]')


class TlsError(Exception):
  """The authority is missing or unreadable, or a certificate cannot be made."""


def supported(jax_version: str) -> bool:
  """Whether JAX `jax_version` ('0.12.0.1') has mutual TLS for its
  coordination service."""
  parts = []
  for piece in jax_version.split('.')[:2]:
    digits = re.match(r'\d+', piece)
    parts.append(int(digits.group()) if digits else 0)
  return tuple(parts) >= MIN_JAX


def uri_part(text: str) -> str:
  """`text` as one segment of a URI path (unsafe characters as '_')."""
  return _URI_UNSAFE.sub('_', text)


def peer_prefix(job: str, attempt: str) -> str:
  """The URI prefix every process of the attempt carries (ends with '/', so
  that attempt 'a1' does not accept 'a10')."""
  return (f'podrun://{uri_part(job) or "job"}/'
          f'{uri_part(attempt) or "attempt"}/')


def has_authority(directory: str) -> bool:
  return all(
      os.path.isfile(os.path.join(directory, name))
      for name in (CA_CERT, CA_KEY))


def _private_write(path: str, data: bytes) -> None:
  """Writes `path` readable by its owner only, from its first byte."""
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  with os.fdopen(fd, 'wb') as f:
    f.write(data)


def _name(text: str):
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.x509.oid import NameOID  # pylint: disable=g-import-not-at-top
  return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text[:64])])


def _pem(key=None, certificate=None) -> bytes:
  from cryptography.hazmat.primitives import serialization  # pylint: disable=g-import-not-at-top
  if certificate is not None:
    return certificate.public_bytes(serialization.Encoding.PEM)
  return key.private_bytes(serialization.Encoding.PEM,
                           serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption())


def make_authority(directory: str,
                   job: str,
                   valid_days: float = VALID_DAYS) -> None:
  """Makes `directory` (0700) and a new authority in it for job `job`."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import hashes  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives.asymmetric import ec  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, mode=0o700, exist_ok=True)
  os.chmod(directory, 0o700)
  key = ec.generate_private_key(ec.SECP256R1())
  now = datetime.datetime.now(datetime.timezone.utc)
  name = _name(f'podrun job {job}')
  certificate = (
      x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(
          key.public_key()).serial_number(
              x509.random_serial_number()).not_valid_before(
                  now - datetime.timedelta(minutes=10)).not_valid_after(
                      now + datetime.timedelta(days=valid_days)).add_extension(
                          x509.BasicConstraints(ca=True, path_length=0),
                          critical=True).add_extension(
                              x509.KeyUsage(digital_signature=True,
                                            key_cert_sign=True,
                                            crl_sign=True,
                                            content_commitment=False,
                                            key_encipherment=False,
                                            data_encipherment=False,
                                            key_agreement=False,
                                            encipher_only=False,
                                            decipher_only=False),
                              critical=True).sign(key, hashes.SHA256()))
  _private_write(os.path.join(directory, CA_KEY), _pem(key=key))
  _private_write(os.path.join(directory, CA_CERT),
                 _pem(certificate=certificate))


@dataclasses.dataclass(frozen=True)
class Credentials:
  """One process's files for JAX, and the peers it accepts."""
  cert_file: str
  key_file: str
  ca_file: str
  peer_prefix: str
  uri: str

  def jax_kwargs(self) -> dict[str, object]:
    """The arguments of jax.distributed.initialize (JAX 0.12 and newer);
    insecure credentials are then refused rather than used."""
    return dict(mtls_cert_file=self.cert_file,
                mtls_key_file=self.key_file,
                mtls_ca_file=self.ca_file,
                mtls_peer_uri_prefix=self.peer_prefix,
                verify_secure_credentials=True)


def _load_authority(directory: str):
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import serialization  # pylint: disable=g-import-not-at-top
  try:
    with open(os.path.join(directory, CA_CERT), 'rb') as f:
      certificate = x509.load_pem_x509_certificate(f.read())
    with open(os.path.join(directory, CA_KEY), 'rb') as f:
      key = serialization.load_pem_private_key(f.read(), password=None)
  except (OSError, ValueError) as e:
    raise TlsError(f'cannot read the job\'s certificate authority in '
                   f'{directory} ({type(e).__name__}: {e}); `podrun-tls '
                   'DIR` makes one (docs/trust.md)') from e
  return certificate, key


def issue(authority_dir: str, job: str, attempt: str, process_index: int,
          out_dir: str) -> Credentials:
  """Issues process `process_index` of `attempt` its certificate, signed by
  the authority in `authority_dir`, into `out_dir` (made 0700).

  Raises:
    TlsError: when the authority cannot be read.
  """
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import hashes  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives.asymmetric import ec  # pylint: disable=g-import-not-at-top
  from cryptography.x509.oid import ExtendedKeyUsageOID  # pylint: disable=g-import-not-at-top
  ca_certificate, ca_key = _load_authority(authority_dir)
  prefix = peer_prefix(job, attempt)
  uri = f'{prefix}process/{process_index}'
  key = ec.generate_private_key(ec.SECP256R1())
  now = datetime.datetime.now(datetime.timezone.utc)
  certificate = (x509.CertificateBuilder().subject_name(
      _name(f'process {process_index}')).issuer_name(
          ca_certificate.subject).public_key(key.public_key()).serial_number(
              x509.random_serial_number()).not_valid_before(
                  now - datetime.timedelta(minutes=10)).not_valid_after(
                      ca_certificate.not_valid_after_utc).add_extension(
                          x509.SubjectAlternativeName(
                              [x509.UniformResourceIdentifier(uri)]),
                          critical=False).add_extension(
                              x509.BasicConstraints(ca=False, path_length=None),
                              critical=True).add_extension(
                                  x509.ExtendedKeyUsage([
                                      ExtendedKeyUsageOID.SERVER_AUTH,
                                      ExtendedKeyUsageOID.CLIENT_AUTH
                                  ]),
                                  critical=False).sign(ca_key, hashes.SHA256()))
  os.makedirs(out_dir, mode=0o700, exist_ok=True)
  names = [
      os.path.join(out_dir, n)
      for n in (f'process_{process_index}.pem', f'process_{process_index}.key',
                CA_CERT)
  ]
  _private_write(names[0], _pem(certificate=certificate))
  _private_write(names[1], _pem(key=key))
  _private_write(names[2], _pem(certificate=ca_certificate))
  return Credentials(names[0], names[1], names[2], peer_prefix=prefix, uri=uri)


def uris(certificate_der: bytes) -> list[str]:
  """The URI names of a DER certificate (a peer's, from a handshake)."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  certificate = x509.load_der_x509_certificate(certificate_der)
  try:
    names = certificate.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
  except x509.ExtensionNotFound:
    return []
  return names.get_values_for_type(x509.UniformResourceIdentifier)


def attempt_of(uri: str) -> Optional[str]:
  """'a2' of 'podrun://job/a2/process/0'; None for another kind of URI."""
  found = re.match(r'^podrun://[^/]+/([^/]+)/', uri)
  return found.group(1) if found else None
