"""A launcher flag declared once, on the typed field that carries its value:
its name, default, `--help` group and line, help text, and whether a local
pod sets it for each rank itself. `launcher/cli_flags.py` defines the absl
flags from the fields, and the process reads them back into the same class.

Example:
  >>> @dataclasses.dataclass(frozen=True)
  ... class Watch:
  ...   heartbeat_timeout: float = flag_spec.flag(
  ...       15, SUPERVISION, 'seconds of silence before a process is lost',
  ...       'Seconds without a heartbeat ...')
  >>> [s.name for s in flag_spec.specs(Watch)]
  ['heartbeat_timeout']
"""

import dataclasses
import typing
from typing import Any, Optional

# --help's groups, in its order (launcher/usage.py lists the flags by them).
WHAT = 'What runs, and where it writes'
LOCAL_POD = 'A local pod of processes on this machine'
CLUSTER = 'A process of a cluster (SLURM, mpirun, Kubernetes, or by hand)'
TRUST = 'Who may join (docs/trust.md)'
SUPERVISION = 'Supervision in every process'
RESTARTS = 'Restarts (a local pod)'
TITLES = (WHAT, LOCAL_POD, CLUSTER, TRUST, SUPERVISION, RESTARTS)

_KEY = 'podrun_flag'


@dataclasses.dataclass(frozen=True)
class Spec:
  """One flag, as its field declares it.

  Attributes:
    name: the flag's name (`--name`).
    field: the field that carries its value (the flag's name but where
      the field's reads better: `enabled` for `--supervision`).
    default: the flag's default, the field's.
    kind: bool, int, float or str; `choices` makes a str an enum.
    group, line: its `--help` group and one line there.
    help: the flag's help text.
    pod_sets: a local pod sets it for each rank itself, so the launcher does
      not hand the user's value on.
    choices: an enum's values.
  """
  name: str
  field: str
  default: Any
  kind: type
  group: str
  line: str
  help: str
  pod_sets: bool = False
  choices: Optional[tuple[str, ...]] = None


def flag(
    default: Any,
    group: str,
    line: str,
    help: str,  # pylint: disable=redefined-builtin
    *,
    kind: Optional[type] = None,
    name: Optional[str] = None,
    pod_sets: bool = False,
    choices: Optional[tuple[str, ...]] = None) -> Any:
  """A dataclass field that is a flag (see Spec); its kind is the field's
  annotation (`Optional[X]`: X) unless `kind` says."""
  if group not in TITLES:
    raise ValueError(f'--help group {group!r}; one of {TITLES}')
  return dataclasses.field(default=default,
                           metadata={
                               _KEY: {
                                   'group': group,
                                   'line': line,
                                   'help': help,
                                   'kind': kind,
                                   'name': name,
                                   'pod_sets': pod_sets,
                                   'choices': choices
                               }
                           })


def same_as(owner: type, field: str) -> Any:
  """A field whose flag another class declares (`owner.field`): it takes
  that default, and the flag is defined once, from `owner`."""
  found = {f.name: f for f in dataclasses.fields(owner)}[field]
  return dataclasses.field(default=found.default,
                           metadata={'podrun_same_as': (owner, field)})


def specs(cls: type) -> tuple[Spec, ...]:
  """The flags `cls` declares, in its fields' order (those it shares
  through `same_as` left to their owner)."""
  out = []
  for f in dataclasses.fields(cls):
    meta = f.metadata.get(_KEY)
    if meta is None:
      continue
    out.append(
        Spec(name=meta['name'] or f.name,
             field=f.name,
             default=f.default,
             kind=meta['kind'] or _kind(f.type),
             group=meta['group'],
             line=meta['line'],
             help=meta['help'],
             pod_sets=meta['pod_sets'],
             choices=meta['choices']))
  return tuple(out)


def _kind(annotation: Any) -> type:
  """bool, int, float or str, from a field's annotation (Optional[X]: X)."""
  if annotation in (bool, int, float, str):
    return annotation
  found = [a for a in typing.get_args(annotation) if a is not type(None)]
  if len(found) == 1 and found[0] in (bool, int, float, str):
    return found[0]
  raise TypeError(f'a flag field is bool, int, float or str (or Optional of '
                  f'one), not {annotation}')


def flag_names(cls: type) -> dict[str, str]:
  """{field: flag name} of every field of `cls` a flag sets, shared ones
  included."""
  out = {}
  for f in dataclasses.fields(cls):
    if _KEY in f.metadata:
      out[f.name] = f.metadata[_KEY]['name'] or f.name
    elif 'podrun_same_as' in f.metadata:
      owner, field = f.metadata['podrun_same_as']
      out[f.name] = flag_names(owner)[field]
  return out
