"""Deprecated: the exit codes moved to `runtime.common.exit_codes`.

A workload raises `runtime.PodrunError` (or imports
`runtime.common.exit_codes`); this name keeps working for one release.
"""

import warnings

from runtime.common.exit_codes import *  # pylint: disable=wildcard-import,unused-wildcard-import

warnings.warn(
    'launcher.exit_codes moved to runtime.common.exit_codes (a workload '
    'raises runtime.PodrunError); the old name goes in the next release',
    DeprecationWarning, stacklevel=2)
