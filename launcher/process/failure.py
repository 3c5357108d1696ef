"""What a failing process says of its failure: one line for the other
processes, and the right amount in its own log.

Example:
  >>> summary_line(ValueError('bad batch'))
  'bad batch'
"""

import traceback

from absl import logging

from launcher.process import peers as peers_lib
from runtime.common import exit_codes


def summary_line(error: BaseException) -> str:
  """What the other processes are told of this one's failure."""
  if isinstance(error, SystemExit):
    return f'SystemExit({error.code!r})'
  if isinstance(error, KeyboardInterrupt):
    return 'KeyboardInterrupt'
  return peers_lib.first_line(error)


def log(error: BaseException, code: int, consequence: bool) -> None:
  if consequence:
    logging.error(
        'this process\'s own error, a consequence of that failure:'
        ' %s', peers_lib.first_line(error))
  elif isinstance(error, SystemExit):
    if code:
      logging.error('exiting with code %d (SystemExit)', code)
  elif isinstance(error, KeyboardInterrupt):
    pass
  elif code == exit_codes.FAILED:
    traceback.print_exception(error)
  elif code == exit_codes.PREEMPTED:
    logging.warning('%s', error)
  else:
    logging.error('%s', error)
