"""The restart flags, declared once for every launcher: `podrun` (absl),
`podrun-tpu` and `podrun-ray` (argparse), read into one `restart.RestartPolicy`.

Example:
  >>> parser = argparse.ArgumentParser()
  >>> add_to(parser)
  >>> args = parser.parse_args(['--max_restarts=2', '--retry_exit_codes=137'])
  >>> policy_of(args.max_restarts, args.restart_backoff,
  ...                args.retry_exit_codes)
  RestartPolicy(max_restarts=2, first_backoff_s=1.0, retryable=(137,))
"""

from typing import Any, Iterable

from launcher import restart

# (name, type, default, help), in the order --help lists them.
FLAGS = (
    ('max_restarts', int, restart.RestartPolicy.max_restarts,
     'start the whole job again, resuming from its checkpoint, up to this '
     'many times after a preemption (exit 75) or a --retry_exit_codes code'),
    ('restart_backoff', float, restart.RestartPolicy.first_backoff_s,
     'a job that trained before it failed restarts at once; attempts that '
     'fail in a row without completing a step wait this many seconds before '
     'the second restart, doubled for each further one, at most 60'),
    ('retry_exit_codes', str, '',
     'exit codes besides 75 that --max_restarts retries, comma-separated, '
     'e.g. 137,124; 0, 1, 2, 3, 5 and 11 never are'),
)
_NAMES = ', '.join(f'--{name}' for name, *_ in FLAGS)


def add_to(parser: Any) -> None:
  """Adds the flags to an argparse parser or argument group."""
  for name, kind, default, text in FLAGS:
    parser.add_argument(f'--{name}',
                        type=kind,
                        default=default,
                        help=text,
                        **({
                            'metavar': 'C,...'
                        } if kind is str else {}))


def define_absl(flags_module: Any,
                module_name: str,
                scope: str = '') -> dict[str, Any]:
  """Defines the flags with absl (`flags_module` is absl.flags) as
  `module_name`'s, their help prefixed by `scope`; returns
  {name: FlagHolder}."""
  define = {
      int: flags_module.DEFINE_integer,
      float: flags_module.DEFINE_float,
      str: flags_module.DEFINE_string
  }
  return {
      name: define[kind](name, default, scope + text, module_name=module_name)
      for name, kind, default, text in FLAGS
  }


def parse_codes(text: str) -> tuple[int, ...]:
  """'137, 124' -> (137, 124).

  Raises:
    ValueError: naming what is not an exit code.
  """
  codes = []
  for word in text.split(','):
    if word.strip():
      try:
        codes.append(int(word))
      except ValueError:
        raise ValueError(f'--retry_exit_codes={text}: {word.strip()!r} is not '
                         'an exit code; give codes like 137,124') from None
  return tuple(codes)


def policy_of(
    max_restarts: int,
    restart_backoff: float,
    retry_exit_codes: str,
    more_codes: Iterable[int] = (),
) -> restart.RestartPolicy:
  """The flags' `RestartPolicy`, with `more_codes` retried too (a config's
  own).

  Raises:
    ValueError: naming the flags and what is wrong with them.
  """
  try:
    codes = parse_codes(retry_exit_codes) + tuple(int(c) for c in more_codes)
    return restart.RestartPolicy(max_restarts, restart_backoff, codes)
  except ValueError as e:
    raise ValueError(f'{_NAMES}: {e}') from None
