"""toolbus dispatcher: runs, calls, policies, slots, leases and events.

`DispatcherApp(settings)` is the service (`start`, `stop`, `ready`); `python -m toolbus_dispatcher`
runs it. Everything else is internal.
"""

from toolbus_dispatcher.app import DispatcherApp
from toolbus_dispatcher.settings import DispatcherSettings

__all__ = ["DispatcherApp", "DispatcherSettings"]
