"""Deprecated: the exit codes moved to `runtime.common.exit_codes`.

A workload raises `runtime.PodrunError` (or imports
`runtime.common.exit_codes`); this name keeps working for one release.
"""

from runtime.common import deprecations
from runtime.common.exit_codes import *  # pylint: disable=wildcard-import,unused-wildcard-import

deprecations.warn('launcher.exit_codes')
