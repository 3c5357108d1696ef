"""Each launcher flag declared once: on the typed field that carries it
(launcher/common/flag_spec.py), from which launcher/cli_flags.py defines
the absl flag. A default, a help text or a --help line restated anywhere
else fails here."""

import ast
import dataclasses

from absl import flags
import pytest

from launcher import cli_flags
from launcher import restart
from launcher import restart_flags
from launcher import usage
from launcher.common import flag_spec
from launcher.common import gpus
from launcher.common import process_flags
from launcher.local import monitor
from tests import helpers

pytestmark = pytest.mark.unit

SPECIFIED = (process_flags.CoordinatorFlags, process_flags.WatchFlags,
             monitor.Timeouts, gpus.GpuPolicy)


def test_every_declared_flag_is_the_absl_flag_built_from_it():
  seen = []
  for cls in SPECIFIED:
    for spec in flag_spec.specs(cls):
      flag = flags.FLAGS[spec.name]
      # absl opens an enum's help with its choices.
      assert flag.default == spec.default and flag.help.endswith(
          spec.help), spec
      assert dict(usage.groups()[usage.TITLES.index(
          spec.group)][1])[spec.name] == spec.line
      seen.append(spec.name)
  assert len(seen) == len(set(seen)), 'a flag declared on two fields'
  assert len(seen) >= 20, seen


def test_a_shared_field_takes_its_owner_s_default():
  """CoordinatorFlags and the pod's Timeouts read flags WatchFlags
  declares; their defaults are WatchFlags', not copies."""
  for cls in SPECIFIED:
    names = flag_spec.flag_names(cls)
    declared = {s.field for s in flag_spec.specs(cls)}
    for field in dataclasses.fields(cls):
      if field.name in names and field.name not in declared:
        assert field.default == flags.FLAGS[names[field.name]].default, field


def _defines() -> list[str]:
  """The flag names of every flags.DEFINE_* call with a literal name in
  launcher/, but those of a FlagValues of their own (the TPU preflight's
  config reader)."""
  names = []
  for path in (helpers.REPO / 'launcher').rglob('*.py'):
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Call) and
          isinstance(node.func, ast.Attribute) and
          node.func.attr.startswith('DEFINE_') and node.args and
          isinstance(node.args[0], ast.Constant) and
          not any(k.arg == 'flag_values' for k in node.keywords)):
        names.append(node.args[0].value)
  return names


def test_no_declared_flag_is_defined_again_by_hand():
  by_hand = _defines()
  declared = {s.name for cls in SPECIFIED for s in flag_spec.specs(cls)}
  assert not declared & set(by_hand), declared & set(by_hand)
  assert len(by_hand) == len(set(by_hand)), by_hand


def test_the_pod_s_own_flags_are_derived_from_the_declarations():
  """A flag a field says the pod sets is never handed on to a rank."""
  for cls in SPECIFIED:
    for spec in flag_spec.specs(cls):
      assert (spec.name in cli_flags.POD_FLAGS) == spec.pod_sets, spec.name


def test_the_restart_flags_default_to_the_policy_s_defaults():
  defaults = {name: default for name, _, default, _ in restart_flags.FLAGS}
  policy = restart.RestartPolicy()
  assert (defaults['max_restarts'],
          defaults['restart_backoff']) == (policy.max_restarts,
                                           policy.first_backoff_s)
