"""What a flag or config mistake says: one line, naming the field and the
fix, for what absl and ml_collections report as an exception.

Example:
  >>> error_detail(KeyError("'batch_sise'\\nDid you mean 'batch_size'?"))
  "no config field 'batch_sise'. Did you mean 'batch_size'?"
"""

import ast
import re

# podrun's sections (runtime/config_base.py) that other trainers use as
# plain fields, and how to say the same in podrun.
_SECTIONS = {
    'model': "Flax's examples set config.model = 'ResNet50': write "
             "config.model.name = 'ResNet50' and read config.model.name in "
             'the workload',
    'profile': "Flax's examples set config.profile = True: set "
               'config.profile.num_steps (steps traced; 0: none) and '
               'config.profile.start_step',
    'optimizer': "write config.optimizer.name = ... and read it where the "
                 'workload builds its optimizer',
    'data': 'write config.data.name = ... and read it in the workload',
    'topology': 'set config.topology.accelerator_type, num_processes or '
                'local_devices',
}
_CLASH = re.compile(
    r"Could not override field '(\w+)'.*cannot be casted to "
    r"type .*ConfigDict|--config\.(\w+)=.*as a ConfigDict", re.S)


def section_clash(text: str) -> str:
  """The error for a config that sets one of podrun's sections to a plain
  value (ml_collections names neither the section nor the fix), or ''."""
  found = _CLASH.search(text)
  name = found and (found.group(1) or found.group(2))
  if name not in _SECTIONS:
    return ''
  return (f'config.{name} is podrun\'s section of fields (runtime/'
          f'config_base.py), not a value: {_SECTIONS[name]}')


def error_detail(error: Exception) -> str:
  """The useful line(s) of a flag or config error, without Python escapes.

  absl reports unknown flags; ml_collections raises KeyError or
  AttributeError for an unknown config key (its message a repr of
  "'key'\\nDid you mean ...") and ValueError for a bad value.
  """
  text = str(error).strip()
  if len(text) > 1 and text[0] == text[-1] and text[0] in '\'"':
    try:
      text = str(ast.literal_eval(text))
    except (ValueError, SyntaxError):
      pass
  lines = [l.strip() for l in text.splitlines() if l.strip()]
  if not lines:
    return ''
  detail = lines[0]
  if detail.endswith(':') and len(lines) > 1:
    detail += ' ' + lines[-1]  # The config file's own error comes last.
  elif len(lines) > 1 and lines[1].startswith('Did you mean'):
    detail = f'no config field {detail}. {lines[1]}'
  return detail
