"""A process that tries to join a running job's coordinator from outside
the job, as tests/test_tls_processes.py starts it:

  python tests/stranger.py HOST:PORT [CERT KEY CA PREFIX]

It calls jax.distributed.initialize as process 1 of 2 (with the given
credentials, or none) and prints `joined` if the coordinator let it in.
JAX aborts the process when its handshake is refused.
"""

import os
import sys

os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=1'
os.environ['JAX_PLATFORMS'] = 'cpu'


def main(argv: list[str]) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  kwargs = {}
  if len(argv) > 2:
    cert, key, ca, prefix = argv[2:6]
    kwargs = dict(mtls_cert_file=cert,
                  mtls_key_file=key,
                  mtls_ca_file=ca,
                  mtls_peer_uri_prefix=prefix)
  print('stranger: connecting', flush=True)
  jax.distributed.initialize(argv[1],
                             num_processes=2,
                             process_id=1,
                             initialization_timeout=5,
                             heartbeat_timeout_seconds=5,
                             **kwargs)
  print('stranger: joined', flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
