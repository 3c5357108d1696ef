"""How a rank's output reads: a `[rank i/N]` prefix and who shows INFO lines.

In a local pod the launcher reads every rank's output and adds the prefix
itself (it also catches what C++ code writes). A process started by a cluster
(one per host) prefixes its own Python output instead.
"""

import io
import logging as std_logging
import os
import re
import sys
from typing import TextIO

from absl import logging

# absl and glog headers: a level letter, then MMDD.
_LOG_HEADER = re.compile(r'^([IWEF])\d{4} ')


def prefix(process_index: int, process_count: int) -> str:
  return f'[rank {process_index}/{process_count}] '


class PrefixedStream(io.TextIOBase):
  """A text stream that writes `prefix` at the start of every line."""

  def __init__(self, stream: TextIO, line_prefix: str):
    self._stream = stream
    self._prefix = line_prefix
    self._at_line_start = True

  def write(self, text: str) -> int:
    out = []
    for piece in text.splitlines(keepends=True):
      if self._at_line_start:
        out.append(self._prefix)
      out.append(piece)
      self._at_line_start = piece.endswith('\n')
    self._stream.write(''.join(out))
    return len(text)

  def flush(self) -> None:
    self._stream.flush()

  def fileno(self) -> int:
    return self._stream.fileno()

  def isatty(self) -> bool:
    return self._stream.isatty()


def setup(process_index: int, process_count: int, supervised: bool,
          log_all_ranks: bool) -> None:
  """Prefixes this process's output and quiets INFO logs on ranks > 0.

  Args:
    process_index: this process.
    process_count: processes in the job.
    supervised: a local-pod launcher reads this output; it prefixes lines and
      filters the console itself, so the rank logs everything unprefixed.
    log_all_ranks: keep INFO logs of every rank.
  """
  if supervised or process_count == 1:
    return
  line_prefix = prefix(process_index, process_count)
  sys.stdout = PrefixedStream(sys.stdout, line_prefix)
  sys.stderr = PrefixedStream(sys.stderr, line_prefix)
  # absl's handler kept the stream it was created with.
  logging.get_absl_handler().python_handler.stream = sys.stderr
  if process_index > 0 and not log_all_ranks:
    logging.set_verbosity(logging.WARNING)


# A rank's own prefix, then words that make a line worth every worker's
# console (the TPU pod driver sees stdout and stderr merged).
_RANK_PREFIX = re.compile(r'^\[rank \d+/\d+\] ')
_ALARMING = re.compile(r'(?i)\b(warn|warning|error|exception|traceback|'
                       r'fatal|failed|killed|stalled|diverged|busy|stale)\b')

# Gloo's line for every CPU collective group a process joins, whenever all
# its peers are there: a 2x4 pod prints four per rank, from threads whose
# writes can interleave ('[Gloo] Rank [Gloo] Rank 0 is ...', then '3 is
# ...'; or 'Rank 0 is connected to 3[Gloo] Rank 1 is connected to 3 peer
# ranks. ...'). Kept in the logs. With every '[Gloo] Rank ' taken out, a
# whole line is one or more 'N is connected to M' and the expected count.
_GLOO_PREFIX = re.compile(r'\[Gloo\] Rank ')
_GLOO_ALL_CONNECTED = re.compile(
    r'^((?:\d+ is connected to \d+)+) peer ranks\. Expected number of '
    r'connected peer ranks is : (\d+)\s*$')
_GLOO_CONNECTED = re.compile(r'\d+ is connected to (\d+)')
# The pieces such an interleaving leaves: '[Gloo] Rank ', or ' peer ranks.
# Expected number of connected peer ranks is : 7'.
_GLOO_FRAGMENT = re.compile(
    r'^(?:(?:\[Gloo\] Rank )+|\s*peer ranks\. Expected number of connected '
    r'peer ranks is : \d+)\s*$')
# JAX's INFO line for each platform it tried and does not have.
_UNUSED_BACKEND = re.compile(
    r"^I\d{4} [^\]]*\] Unable to initialize backend '[\w-]+'")


def routine(line: str) -> bool:
  """Whether a line is a library's routine chatter, kept from the console
  (it stays in the logs): Gloo's "connected to 7 peer ranks" when 7 were
  expected (a group that did not connect fully is shown), and JAX's INFO
  line for a platform it tried and does not have ('tpu' on a machine
  without one; a failing platform the job asked for raises instead).

  Example:
    >>> routine('[Gloo] Rank 0 is connected to 7 peer ranks. Expected '
    ...         'number of connected peer ranks is : 7')
    True
  """
  line = _RANK_PREFIX.sub('', line)
  if _UNUSED_BACKEND.match(line) or _GLOO_FRAGMENT.match(line):
    return True
  if _emulated_storage() and _EMULATOR_AUTH.match(line):
    return True
  found = _GLOO_ALL_CONNECTED.match(_GLOO_PREFIX.sub('', line))
  return found is not None and all(
      connected == found.group(2)
      for connected in _GLOO_CONNECTED.findall(found.group(1)))


# tensorstore's line (C++, so not a Python log record) when it finds no
# credentials, which a storage emulator does not need.
_EMULATOR_AUTH = re.compile(
    r'^E\d{4} [^\]]*google_auth_provider\.cc:\d+\] Could not find the '
    r'credentials file')
# google-auth's loggers that warn, several times a client, when there is no
# metadata server: the case of every machine that uses a storage emulator.
_AUTH_LOGGERS = ('google.auth._default', 'google.auth.compute_engine._metadata')


def _emulated_storage() -> bool:
  return bool(os.environ.get('STORAGE_EMULATOR_HOST'))


def _not_routine(record: std_logging.LogRecord) -> bool:
  return not (record.levelno <= std_logging.INFO and
              record.getMessage().startswith('Unable to initialize backend'))


def _above_warning(record: std_logging.LogRecord) -> bool:
  return record.levelno > std_logging.WARNING


def quiet_routine_logs() -> None:
  """Keeps this process's routine library log lines off its output: JAX's
  INFO line for each platform it does not have, and, when a storage
  emulator is set (STORAGE_EMULATOR_HOST), google-auth's warnings that
  there is no metadata server. Call it before JAX picks its backends."""
  std_logging.getLogger('jax._src.xla_bridge').addFilter(_not_routine)
  if _emulated_storage():
    for name in _AUTH_LOGGERS:
      std_logging.getLogger(name).addFilter(_above_warning)


def alarming(line: str) -> bool:
  """Whether a line of merged output is a warning or an error: an absl or
  glog W/E/F header, or a word such as error, traceback or failed.

  Example:
    >>> alarming('[rank 3/64] W1201 12:00:00.1 x.py:1] slow step')
    True
  """
  line = _RANK_PREFIX.sub('', line)
  header = _LOG_HEADER.match(line)
  if header:
    return header.group(1) != 'I'
  return bool(_ALARMING.search(line))


def shown_on_console(process_index: int, stream: str, line: str,
                     log_all_ranks: bool) -> bool:
  """Whether the local-pod launcher echoes a rank's line on its console.

  Rank 0 is shown in full but for `routine` lines; other ranks show what
  they write to stderr (warnings, errors, tracebacks) except INFO log lines.
  `log_all_ranks` shows everything.
  """
  if log_all_ranks:
    return True
  if routine(line):
    return False
  if process_index == 0:
    return True
  if stream != 'stderr':
    return False
  header = _LOG_HEADER.match(line)
  return not (header and header.group(1) == 'I')
