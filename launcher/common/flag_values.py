"""A launcher flag's value read from a command line as absl reads it.

The drivers (TPU, Ray) pass the launcher's flags through untouched, yet need
one or two of them (the workdir, where the record goes) before any process
parses them. absl takes the last of repeated flags, in either spelling
(`--workdir=X` or `--workdir X`, one dash or two), and stops at `--`; so
does this, so that a driver and the job never disagree on a value.

Example:
  >>> last_value(['--workdir=a', '--workdir', 'b'], 'workdir')
  'b'
  >>> LaunchArgs(['--config=configs/mnist.py']).workdir  # None: the default
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


class LaunchArgs(tuple):
  """The launcher's flags that a driver hands every process unchanged
  (what follows `--` on its command line), with the few the driver reads
  itself, each read as absl will read it (`last_value`).

  A tuple of the words, so that it goes onto a command line as it is.

  Example:
    >>> own, args = LaunchArgs.split(['--num_processes=4', '--',
    ...                               '--config=c.py', '--workdir=gs://b/r'])
    >>> own, args.workdir, args.config, args.tls
    (['--num_processes=4'], 'gs://b/r', 'c.py', 'auto')
  """
  __slots__ = ()

  @classmethod
  def split(cls, argv: Sequence[str]) -> tuple[list[str], 'LaunchArgs']:
    """(the driver's own flags, before the first `--`; the launcher's,
    after it)."""
    argv = list(argv)
    if '--' not in argv:
      return argv, cls()
    at = argv.index('--')
    return argv[:at], cls(argv[at + 1:])

  def value(self, name: str) -> Optional[str]:
    """--`name`'s value, e.g. 'config.topology.accelerator_type'; None if
    absent."""
    return last_value(list(self), name)

  @property
  def workdir(self) -> Optional[str]:
    """--workdir; None for the launcher's default."""
    return self.value('workdir')

  @property
  def config(self) -> Optional[str]:
    """--config's PATH[:ARG]; None if absent."""
    return self.value('config')

  @property
  def tls(self) -> str:
    """--tls, 'auto' when absent (launcher/tls.py)."""
    return self.value('tls') or 'auto'

  def with_workdir(self, workdir: str) -> 'LaunchArgs':
    """These flags, with --workdir set to `workdir` after them."""
    return LaunchArgs((*self, f'--workdir={workdir}'))
