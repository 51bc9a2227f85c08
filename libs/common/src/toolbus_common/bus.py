"""The service framework's names where services have always imported them from; the code lives
in `toolbus_common.framework` (one module per job), whose `__all__` is the one list of them."""

from __future__ import annotations

from toolbus_common.framework import *  # noqa: F403
from toolbus_common.framework import __all__ as __all__
