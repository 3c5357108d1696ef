"""Mutual TLS for a job's coordinator, on the supervising side: which mode
a launch runs in (--tls), the local pod's private authority, and
`podrun-tls DIR`, which makes an authority for a cluster's job.

Nothing here imports JAX: the installed version is read from its metadata.

Example:
  $ podrun-tls /shared/jobs/run7/tls      # once, before srun
  $ srun ... podrun --config=... --tls_dir=/shared/jobs/run7/tls
"""

import argparse
import importlib.metadata
import os
import shutil
import sys
import tarfile
import tempfile
import uuid
from typing import Optional

from runtime.common import exit_codes
from launcher.common import job_tls

AUTO, REQUIRE, OFF, MODES = (job_tls.AUTO, job_tls.REQUIRE, job_tls.OFF,
                             job_tls.MODES)


def jax_version() -> str:
  """The installed JAX's version, without importing it ('' if none)."""
  try:
    return importlib.metadata.version('jax')
  except importlib.metadata.PackageNotFoundError:
    return ''


def unsupported_line(version: str) -> str:
  """What a launch says once where JAX has no mutual TLS."""
  return (f'JAX {version} has no mutual TLS for its coordination service '
          f'(JAX {".".join(map(str, job_tls.MIN_JAX))} and newer have it): '
          'this job\'s coordinator accepts any process that reaches its '
          'port; keep that port inside the job\'s own network (docs/trust.md)')


def check_required(mode: str, version: Optional[str] = None) -> None:
  """Refuses --tls=require on a JAX without mutual TLS.

  Raises:
    exit_codes.ConfigError: naming the installed version.
  """
  version = jax_version() if version is None else version
  if mode == REQUIRE and not job_tls.supported(version):
    raise exit_codes.ConfigError(
        f'--tls=require: the installed JAX {version or "(none)"} has no '
        'mutual TLS for its coordination service; it needs JAX '
        f'{".".join(map(str, job_tls.MIN_JAX))} or newer (pip install -U '
        '"jax>=0.12"), or run with --tls=auto or --tls=off')


class PodAuthority:
  """A local pod's authority, in a private temporary directory for the
  launch's life: made when the mode and JAX allow, removed by `close`.

  Attributes:
    directory: the authority's directory, or None when the pod runs
      without TLS (then `process_args` says so to every process).
  """

  def __init__(self,
               mode: str,
               job: str,
               say=None,
               version: Optional[str] = None):
    version = jax_version() if version is None else version
    check_required(mode, version)
    self.directory = None
    if mode == OFF:
      return
    if not job_tls.supported(version):
      if say is not None:
        say(unsupported_line(version))
      return
    self.directory = tempfile.mkdtemp(prefix='podrun-tls-')
    job_tls.make_authority(self.directory, job)

  def process_args(self) -> list[str]:
    """Each rank's flags: the authority, or TLS off, decided here once."""
    if self.directory is None:
      return [f'--tls={OFF}']
    return [f'--tls={REQUIRE}', f'--tls_dir={self.directory}']

  def close(self) -> None:
    if self.directory is not None:
      shutil.rmtree(self.directory, ignore_errors=True)
      self.directory = None


def archive(directory: str, out: str) -> None:
  """The authority's files as a .tar.gz that keeps their mode (0600), for a
  driver to copy to its workers."""
  with tarfile.open(out, 'w:gz') as tar:
    for name in (job_tls.CA_CERT, job_tls.CA_KEY):
      tar.add(os.path.join(directory, name), arcname=name)
  os.chmod(out, 0o600)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='podrun-tls',
      description='Makes a job\'s certificate authority in DIR (mode 0700) '
      'for --tls_dir: every process of the job reads it and issues itself a '
      'certificate at its start. Put DIR where only the job\'s user reads, '
      'on a path every host of the job sees.')
  parser.add_argument('directory', metavar='DIR')
  parser.add_argument('--job',
                      default='',
                      help='a name for the authority (default: a random id)')
  parser.add_argument('--force',
                      action='store_true',
                      help='replace an authority already in DIR')
  return parser


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  if job_tls.has_authority(args.directory) and not args.force:
    print(
        f'podrun-tls: {args.directory} already holds an authority; '
        '--force replaces it (running jobs that use it then fail to '
        'restart)',
        file=sys.stderr)
    return exit_codes.CONFIG_ERROR
  job_tls.make_authority(args.directory, args.job or uuid.uuid4().hex[:12])
  print(f'podrun-tls: made an authority in {args.directory}; pass '
        f'--tls_dir={args.directory} to every process of the job')
  if not job_tls.supported(jax_version()):
    print(f'podrun-tls: {unsupported_line(jax_version())}', file=sys.stderr)
  return 0


def run() -> None:
  """`podrun-tls DIR`."""
  sys.exit(main(sys.argv[1:]))


if __name__ == '__main__':
  run()
