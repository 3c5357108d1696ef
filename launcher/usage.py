"""`podrun --help`: the launcher's own flags, grouped, one line each.

absl's `--help` lists the flags of the main module (launcher/__main__.py
defines none) and `--helpfull` opens with absl's own; this lists the flags
of launcher/cli.py by what they are for. `--helpfull` still shows every flag.

Example:
  >>> print(usage.text(flags.FLAGS))
"""

from absl import flags

from launcher.common import flag_spec

# --help's groups, in its order. Each flag of launcher/cli.py joins one
# where it is defined (`declare`), with one line of its own; the flag's
# help has the rest.
# (launcher/common/flag_spec.py holds them, for the flags declared on the
# fields that carry them.)
WHAT, LOCAL_POD, CLUSTER = flag_spec.WHAT, flag_spec.LOCAL_POD, flag_spec.CLUSTER
TRUST, SUPERVISION = flag_spec.TRUST, flag_spec.SUPERVISION
RESTARTS, TITLES = flag_spec.RESTARTS, flag_spec.TITLES

# {flag name: (group, one line)}, in the order the flags are declared.
_DECLARED: dict[str, tuple[str, str]] = {}


def declare(holder: flags.FlagHolder, group: str, summary: str) -> None:
  """Puts the flag `holder` defines in --help's `group` with the one-line
  `summary`, once.

  Raises:
    ValueError: for a group not in TITLES, or a flag declared twice.
  """
  if group not in TITLES:
    raise ValueError(f'--help group {group!r}; one of {TITLES}')
  if holder.name in _DECLARED:
    raise ValueError(f'--{holder.name} is already in --help\'s group '
                     f'{_DECLARED[holder.name][0]!r}')
  _DECLARED[holder.name] = (group, summary)


def groups() -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
  """((group, ((flag name, one line), ...)), ...) in --help's order."""
  return tuple((title,
                tuple((name, summary)
                      for name, (group, summary) in _DECLARED.items()
                      if group == title))
               for title in TITLES)


HELP_ARGS = ('--help', '-help', '-h', '-?', '--helpshort', '-helpshort')

_HEAD = """\
podrun: run a JAX job on this machine, a local pod of processes, a cluster
or a Cloud TPU pod (scripts/launch_tpu_pod.sh).

  podrun --config=configs/linear_regression.py
  podrun --config=my_config.py --local_processes=2 --local_devices=4
  podrun --config=configs/mlp.py --config.steps=500 --workdir=/tmp/mlp

--config.FIELD=VALUE overrides any field of the config (runtime/config_base.py
lists them). --helpfull lists absl's own flags too.
"""


def _line(flag: flags.Flag, summary: str) -> str:
  if flag.boolean:
    name = f'--[no]{flag.name}'
    default = 'on' if flag.default else 'off'
  else:
    name = f'--{flag.name}'
    default = ('' if flag.default in (None, []) else flag.default_as_str or '')
  shown = f' (default {default.strip(chr(39))})' if default else ''
  return f'  {name:<30} {summary}{shown}'


def text(flag_values: flags.FlagValues) -> str:
  """The help: a few examples, then each group's flags, one line each."""
  out = [_HEAD]
  for title, entries in groups():
    out.append(f'{title}:')
    out.extend(_line(flag_values[name], summary) for name, summary in entries)
    out.append('')
  return '\n'.join(out)
