"""`python -m toolbus_registry`: serve the registry subjects until SIGTERM."""

import asyncio

from toolbus_common import Settings, run_service

from toolbus_registry.app import RegistryApp
from toolbus_registry.memory import bound_worker_threads, limit_arenas


async def _build(settings: Settings) -> RegistryApp:
    bound_worker_threads(asyncio.get_running_loop())
    return RegistryApp(settings)


if __name__ == "__main__":
    limit_arenas()  # before the service's threads allocate (see toolbus_registry.memory)
    run_service(_build)
