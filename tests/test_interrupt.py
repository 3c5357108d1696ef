"""SIGINT ends a process whose main thread does not stop by itself."""

import signal
import subprocess
import sys
import time

import pytest

from launcher.process import interrupt
from tests import helpers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(60)]

# The main thread ignores SIGINT, as one blocked in a collective does.
_CHILD = '''
import os, signal, sys, time
from launcher.process import interrupt
signal.signal(signal.SIGINT, lambda *a: None)
interrupt.install(0.2, lambda code: (print('exiting', code, flush=True),
                                     os._exit(code)))
print('ready', flush=True)
time.sleep(60)
'''


def test_sigint_ends_a_process_whose_main_thread_does_not_stop():
  child = subprocess.Popen([sys.executable, '-c', _CHILD],
                           cwd=helpers.REPO,
                           stdout=subprocess.PIPE,
                           text=True,
                           start_new_session=True)
  try:
    assert child.stdout.readline() == 'ready\n'
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=30) == interrupt.INTERRUPTED
    assert time.monotonic() - sent >= 0.2  # The main thread's grace.
    assert child.stdout.read() == f'exiting {interrupt.INTERRUPTED}\n'
  finally:
    if child.poll() is None:
      child.kill()
