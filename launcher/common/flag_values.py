"""A launcher flag's value read from a command line as absl reads it.

The drivers (TPU, Ray) pass the launcher's flags through untouched, yet need
one or two of them (the workdir, where the record goes) before any process
parses them. absl takes the last of repeated flags, in either spelling
(`--workdir=X` or `--workdir X`, one dash or two), and stops at `--`; so
does this, so that a driver and the job never disagree on a value.

Example:
  >>> last_value(['--workdir=a', '--workdir', 'b'], 'workdir')
  'b'
  >>> workdir_of(['--config=configs/mnist.py'])  # None: the default
"""

import re
from typing import Optional, Sequence


def env_pairs(pairs: Sequence[str]) -> dict[str, str]:
  """--env's KEY=VALUE pairs as {KEY: VALUE}, the last of a KEY winning.

  Raises:
    ValueError: naming a pair that is not KEY=VALUE with KEY a variable name.

  Example:
    >>> env_pairs(['WANDB_API_KEY=k', 'XLA_FLAGS=--xla_dump_to=/tmp/x'])
    {'WANDB_API_KEY': 'k', 'XLA_FLAGS': '--xla_dump_to=/tmp/x'}
  """
  out = {}
  for pair in pairs:
    if not re.match(r'^[A-Za-z_][A-Za-z0-9_]*=', pair):
      raise ValueError(f'--env {pair}: expected KEY=VALUE with KEY a '
                       'variable name')
    key, _, value = pair.partition('=')
    out[key] = value
  return out


def last_value(args: list[str], name: str) -> Optional[str]:
  """The value of `--name` in `args` (the last given), or None if absent.

  Args:
    args: the launcher's flags, e.g. ['--config=c.py', '--workdir', 'w'].
    name: the flag's name without dashes, e.g. 'workdir'.
  """
  found = None
  spellings = (f'--{name}', f'-{name}')
  i = 0
  while i < len(args):
    arg = args[i]
    if arg == '--':
      break
    flag, sep, value = arg.partition('=')
    if flag in spellings:
      if sep:
        found = value
      elif i + 1 < len(args):
        found = args[i + 1]
        i += 1
    i += 1
  return found


def workdir_of(args: list[str]) -> Optional[str]:
  """The --workdir the launcher gets from `args`; None for its default."""
  return last_value(args, 'workdir')
