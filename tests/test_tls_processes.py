"""Who may join a job: a running 2x4 local pod with mutual TLS (JAX 0.12
and newer) refuses strangers at its coordinator and trains on, bit for bit
as if they had never come; its coordinator listens on 127.0.0.1 only.

The strangers (tests/stranger.py) are processes of their own calling
jax.distributed.initialize as process 1: without credentials, with another
job's, and with this job's authority but an earlier attempt's name; and a
plain TCP client that sends bytes that are not TLS.
"""

import ipaddress
import os
import pathlib
import socket
import subprocess
import sys
import time

import jax
import pytest

from runtime.common import handoff
from runtime.common import exit_codes
from launcher.common import job_tls
from tests import cluster
from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

# As conftest's probe_2x4_straight, whose fingerprint the job must match;
# rank 0's slow steps (0.25 s each, 15 s in all) keep it running while the
# strangers try, and change no bit of what is trained.
JOB = [
    f'--config={helpers.PROBE_CONFIG}', '--config.log_every=1',
    '--config.checkpoint_every=10', f'--config.steps={helpers.STRAIGHT_STEPS}',
    '--local_processes=2', '--local_devices=4', '--config.fail_mode=slow',
    '--config.fail_rank=0', '--config.fail_step=0', '--config.fail_seconds=0.25'
]
_NEEDS_TLS = pytest.mark.skipif(
    not job_tls.supported(jax.__version__),
    reason=f'JAX {jax.__version__} has no mutual TLS; test_job_tls.py covers '
    'what the launcher says there')


def _proc_file(pid: int, name: str) -> list[str]:
  with open(f'/proc/{pid}/{name}', 'rb') as f:
    return f.read().decode().split('\0')


def _listening(port: int) -> set[str]:
  """The addresses listening on `port`, from /proc/net/tcp and tcp6 (an
  IPv4-mapped IPv6 address as the IPv4 one)."""
  found = set()
  for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    with open(table) as f:
      for line in f.readlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.rsplit(':', 1)
        if state != '0A' or int(hex_port, 16) != port:
          continue
        # The kernel writes each 32-bit word in host (little-endian) order.
        raw = b''.join(
            bytes.fromhex(address[i:i + 8])[::-1]
            for i in range(0, len(address), 8))
        ip = ipaddress.ip_address(raw)
        found.add(str(getattr(ip, 'ipv4_mapped', None) or ip))
  return found


def _strangers(address: str, authority: str, attempt: str, job: str,
               tmp_path: pathlib.Path) -> dict[str, subprocess.Popen]:
  other = tmp_path / 'other_job'
  job_tls.make_authority(str(other), 'other')
  theirs = job_tls.issue(str(other), 'other', 'other-a1', 1,
                         str(tmp_path / 'other_issued'))
  stale = job_tls.issue(authority, job,
                        attempt.rsplit('-a', 1)[0] + '-a0', 1,
                        str(tmp_path / 'stale_issued'))
  script = str(helpers.REPO / 'tests' / 'stranger.py')
  start = lambda *args: subprocess.Popen(
      [sys.executable, script, address, *args],
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      env=helpers.launcher_env(),
      start_new_session=True)
  return {
      'no credentials':
          start(),
      'another job':
          start(theirs.cert_file, theirs.key_file, theirs.ca_file,
                theirs.peer_prefix),
      'an earlier attempt':
          start(stale.cert_file, stale.key_file, stale.ca_file,
                stale.peer_prefix)
  }


@_NEEDS_TLS
def test_strangers_are_refused_and_the_job_trains_on(tmp_path,
                                                     probe_2x4_straight):
  port = cluster.free_port()
  workdir = tmp_path / 'job'
  proc = helpers.start_launcher(
      [*JOB, f'--workdir={workdir}', f'--coordinator_address=127.0.0.1:{port}'])
  started = time.monotonic()
  try:
    assert helpers.wait_for(
        lambda: proc.poll() is not None or 'step 5/' in
        ((workdir / 'logs' / 'rank_0.log').read_text()
         if (workdir / 'logs' / 'rank_0.log').exists() else ''), 120)
    assert proc.poll() is None, helpers.finish(proc, 10, started).output
    assert _listening(port) == {'127.0.0.1'}
    rank_1 = helpers.rank_pids(workdir)[1]
    flags = dict(
        a.split('=', 1)
        for a in _proc_file(rank_1, 'cmdline')
        if a.startswith('--tls'))
    environ = dict(
        e.split('=', 1) for e in _proc_file(rank_1, 'environ') if '=' in e)
    assert flags['--tls'] == 'require', flags
    strangers = _strangers(f'127.0.0.1:{port}', flags['--tls_dir'],
                           environ[handoff.ATTEMPT], environ[handoff.JOB_ID],
                           tmp_path)
    with socket.create_connection(('127.0.0.1', port), timeout=5) as raw:
      raw.sendall(b'GET / HTTP/1.1\r\nHost: x\r\n\r\n' * 4)
    for name, stranger in strangers.items():
      out, _ = stranger.communicate(timeout=60)
      assert 'stranger: connecting' in out, (name, out)
      assert stranger.returncode != 0 and 'joined' not in out, (name, out)
    assert proc.poll() is None, 'the job ended while strangers called'
    result = helpers.finish(proc, 150, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 0, result.output
  assert (helpers.fingerprints(workdir, 2) == helpers.fingerprints(
      probe_2x4_straight, 2))
  # The launcher's authority went with it.
  assert not os.path.exists(flags['--tls_dir'])


@_NEEDS_TLS
def test_processes_started_by_hand_share_an_authority_and_refuse_a_stale_one(
    tmp_path):
  authority = tmp_path / 'tls'
  made = subprocess.run([sys.executable, '-m', 'launcher.tls',
                         str(authority)],
                        capture_output=True,
                        text=True,
                        cwd=helpers.REPO,
                        check=False)
  assert made.returncode == 0, made.stderr
  port = cluster.free_port()
  args = [
      f'--config={helpers.PROBE_CONFIG}', '--config.steps=40',
      '--config.checkpointing=False', '--config.fail_mode=slow',
      '--config.fail_rank=0', '--config.fail_step=0',
      '--config.fail_seconds=0.25', '--tls=require', f'--tls_dir={authority}'
  ]
  attempt = lambda name: {handoff.JOB_ID: 'run', handoff.ATTEMPT: name}
  with cluster.Cluster(tmp_path / 'job',
                       2,
                       args,
                       port=port,
                       rank_env={
                           0: attempt('run-a2'),
                           1: attempt('run-a2')
                       }) as job:
    job.wait_until_stepping()
    with cluster.Cluster(tmp_path / 'stale',
                         2,
                         args,
                         port=port,
                         start=[1],
                         rank_env={1: attempt('run-a1')}) as stale:
      refused = stale.wait(timeout=60)[1]
    exits = job.wait(timeout=120)
  assert refused.code == exit_codes.DISTRIBUTED_INIT_FAILED, refused.output
  assert (f'the coordinator at 127.0.0.1:{port} runs attempt run-a2, and this '
          'process belongs to attempt run-a1') in refused.output
  assert [exits[r].code for r in (0, 1)] == [0, 0], exits[0].output
  assert 'with mutual TLS as podrun://run/run-a2/process/0' in exits[0].output


def test_a_process_0_started_by_hand_listens_on_the_address_it_names(tmp_path):
  port = cluster.free_port()
  proc = helpers.start_launcher([
      f'--config={helpers.PROBE_CONFIG}', '--config.steps=40',
      '--config.checkpointing=False', '--config.fail_mode=slow',
      '--config.fail_rank=0', '--config.fail_step=0',
      '--config.fail_seconds=0.1', '--tls=off', f'--workdir={tmp_path}',
      f'--coordinator_address=127.0.0.1:{port}', '--num_processes=1',
      '--process_id=0'
  ])
  started = time.monotonic()
  try:
    assert helpers.wait_for(lambda: proc.poll() is not None or _listening(port),
                            60, 0.05)
    listening = _listening(port)
    result = helpers.finish(proc, 90, started)
  finally:
    helpers.kill_group(proc)
  assert result.returncode == 0, result.output
  # Not [::] nor 0.0.0.0, as JAX would by default.
  assert listening == {'127.0.0.1'}, listening
  assert 'the coordinator listens on 127.0.0.1' in result.stderr
