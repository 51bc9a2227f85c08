"""`python -m toolbus_registry`: serve the registry subjects until SIGTERM."""

from toolbus_common import Settings, run_service

from toolbus_registry.app import RegistryApp


async def _build(settings: Settings) -> RegistryApp:
    return RegistryApp(settings)


if __name__ == "__main__":
    run_service(_build)
