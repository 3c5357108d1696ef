"""Deprecated: the base config is `runtime.config_base` now.

`from configs import base` goes on working wherever the project has no
`configs` package of its own (podrun's `configs` is a namespace portion, so
a project's own configs/default.py sits beside this file); it warns once.
"""

import warnings

from runtime.config_base import get_config  # pylint: disable=unused-import

warnings.warn(
    '`from configs import base` is deprecated: write `from runtime import '
    'config_base` and `config_base.get_config()`; podrun\'s `configs` name '
    'may be the project\'s own',
    FutureWarning,
    stacklevel=2)
