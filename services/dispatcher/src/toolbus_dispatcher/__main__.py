"""`python -m toolbus_dispatcher`: serve runs and calls until SIGTERM."""

from toolbus_common.runtime import run_service

from toolbus_dispatcher.app import DispatcherApp
from toolbus_dispatcher.settings import DispatcherSettings


async def _build(_settings: object) -> DispatcherApp:
    return DispatcherApp(DispatcherSettings())


def main() -> None:
    run_service(_build)


if __name__ == "__main__":
    main()
