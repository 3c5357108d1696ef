"""How a workload's own loop reports progress: `runtime.progress.report(step)`.

The module lives in runtime/common/progress.py, where the supervisor reads
it too; this name is the one workloads import.
"""

from runtime.common.progress import *  # pylint: disable=wildcard-import,unused-wildcard-import
