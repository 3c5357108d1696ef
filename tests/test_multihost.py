"""Processes started one per "host", as a cluster starts them: no local pod.

Each process is `python -m launcher` with explicit coordinator flags; it
prefixes its own output with `[rank i/N]` and only rank 0 logs INFO lines.
"""

import socket
import time

import pytest

from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]


def _two_by_hand(tmp_path, *flags: str) -> list[helpers.Result]:
  """Two processes started as a scheduler starts them, with `flags`."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  address = f'127.0.0.1:{port}'
  started = time.monotonic()
  procs = [
      helpers.start_launcher([
          '--config=configs/linear_regression.py', f'--workdir={tmp_path}',
          '--local_devices=4', f'--coordinator_address={address}',
          f'--coordinator_bind_address={address}', '--num_processes=2',
          f'--process_id={i}', '--initialization_timeout=60', *flags
      ]) for i in range(2)
  ]
  try:
    return [helpers.finish(p, 120, started) for p in procs]
  finally:
    for p in procs:
      helpers.kill_group(p)


def test_two_hosts_with_explicit_coordinator_flags(tmp_path):
  results = _two_by_hand(tmp_path, '--config.steps=30')
  for r in results:
    assert r.returncode == 0, r.output
  rank0, rank1 = results
  assert '[rank 0/2] I' in rank0.stderr and 'step 30/30' in rank0.stderr
  # Every line a rank prints carries its prefix (C++ log lines from XLA are
  # written below Python and are not prefixed).
  python_lines = [
      l for l in rank0.stderr.splitlines()
      if '.py:' in l and not l.startswith('[rank 0/2] ')
  ]
  assert not python_lines, python_lines
  assert not any(
      l.startswith('[rank 1/2] I')
      for l in rank1.stderr.splitlines()), rank1.stderr
  prints = [
      helpers.read_json(tmp_path / 'ranks' / f'rank_{i}.json') for i in range(2)
  ]
  assert prints[0]['fingerprint'] == prints[1]['fingerprint']
  summary = helpers.read_json(tmp_path / 'summary.json')
  assert (summary['process_count'], summary['device_count']) == (2, 8)


def test_processes_by_hand_say_the_fewest_they_may_run_on_again(tmp_path):
  """--min_replicas on processes a scheduler starts: every count from it to
  this attempt's is checked before step 1, as a launcher's elastic range
  is. A replica of several processes is refused; each process a replica
  trains."""
  spanning = _two_by_hand(tmp_path / 'all', '--config.steps=20',
                          '--min_replicas=1', '--config.state_layout=sharded',
                          '--config.replica=all')
  for r in spanning:
    assert r.returncode == 2, r.output
  assert ("config.replica='all' in an elastic job (processes 1-2)"
          in spanning[0].stderr), spanning[0].stderr
  each = _two_by_hand(tmp_path / 'process', '--config.steps=20',
                      '--min_replicas=1', '--config.state_layout=sharded')
  for r in each:
    assert r.returncode == 0, r.output
  assert 'step 20/20' in each[0].stderr
