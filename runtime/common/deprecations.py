"""Every old spelling that still works through 0.2.x, in one table.

A shim (a renamed function that calls the new one, a keyword kept, a module
left behind) calls `warn(KEY, ...)` with its key in `RENAMED`; nothing else
in the project raises a DeprecationWarning (tests/test_front_door.py checks
both ways), so this table is the list of what goes in 0.3.0.
runtime/__init__.py shows these warnings, which Python hides by default
outside __main__.

Example:
  >>> deprecations.warn('parallelism.of')
  DeprecationWarning: parallelism.of(config) is now
  parallelism.from_config(config); the old name goes in 0.3.0
"""

import warnings

# The words every message ends with; runtime/__init__.py's filter shows them.
# 0.2.0 is the first release: these spellings work through 0.2.x.
ENDING = 'the old name goes in 0.3.0'

# key -> what to write instead; {fields} are the caller's.
RENAMED = {
    'runtime.MODULE.NAME':
        ('runtime.{old}.{attribute}: runtime.{old} is now the function '
         'itself; write runtime.{attribute} or {module}.{attribute}'),
    'parallelism.of':
        ('parallelism.of(config) is now parallelism.from_config(config)'),
    'parallelism.process_slice':
        ('parallelism.process_slice is now parallelism.process_rows'),
    'Run.host_state':
        'run.host_state() is now run.numpy_state()',
    'Run.config':
        ('run.config is now run.options, what train read of the config '
         '(runtime/options.py)'),
    'Task(evaluate=...)':
        'Task(evaluate=...) is now Task(eval_fn=...)',
    'Periodic.run':
        '{hook}.run(run): override work(run) instead',
    'launcher.exit_codes':
        ('launcher.exit_codes moved to runtime.common.exit_codes (a workload '
         'raises runtime.PodrunError)'),
}


def message(key: str, **fields: str) -> str:
  """The warning's text for `key`, its fields filled in."""
  return f'{RENAMED[key].format(**fields)}; {ENDING}'


def warn(key: str, stacklevel: int = 3, **fields: str) -> None:
  """Warns, once per place that uses the old spelling, that `key` goes.

  Args:
    key: the old spelling, a key of RENAMED.
    stacklevel: as warnings.warn's, counted from the shim's caller (3: the
      code that called the shim that calls this).
    **fields: the message's {fields}.
  """
  warnings.warn(message(key, **fields),
                DeprecationWarning,
                stacklevel=stacklevel)
