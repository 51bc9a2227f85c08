"""Run a service: logging, health/readiness/metrics over HTTP, signals, graceful stop.

A service is any object with `start()`, `stop()` and `ready()`; `run_service` owns the rest, so
every `__main__.py` is three lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

import orjson
import uvicorn
import yaml
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from toolbus_common.logging import configure, register_secret
from toolbus_common.settings import Settings

log = logging.getLogger(__name__)


class Service(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def ready(self) -> bool: ...

    def asyncapi(self) -> dict[str, Any]: ...


def health_app(service: Service) -> Starlette:
    """`/healthz` (alive), `/readyz` (connected and serving), `/metrics` (Prometheus),
    `/asyncapi` (the service's AsyncAPI 3 document as JSON) and `/asyncapi.yaml`."""
    document: dict[str, Any] = {}

    def spec() -> dict[str, Any]:
        if not document:  # built once, on first use: it is the same for the life of the process
            document.update(service.asyncapi())
        return document

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok", "service": service.name})

    async def readyz(_: Request) -> Response:
        ready = service.ready()
        return JSONResponse({"ready": ready, "service": service.name}, status_code=200 if ready else 503)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    async def asyncapi(_: Request) -> Response:
        return Response(orjson.dumps(spec()), media_type="application/json")

    async def asyncapi_yaml(_: Request) -> Response:
        return Response(
            yaml.safe_dump(spec(), sort_keys=True, allow_unicode=True), media_type="application/yaml"
        )

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/asyncapi", asyncapi),
            Route("/asyncapi.yaml", asyncapi_yaml),
            # A service may serve routes of its own beside these (the credentials service's OAuth callback).
            *getattr(service, "http_routes", list)(),
        ]
    )


GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """Keep the cyclic garbage collector out of request latency.

    A service holds large long-lived state (pinned toolsets, search indexes, validators); with
    CPython's defaults a full collection walks all of it every few thousand allocations, a 70-80 ms
    pause per 1,000 cached tools measured here. Objects alive after start-up are frozen out of
    collection, and young collections run every 50,000 allocations instead of 700. toolbus's own
    data structures are acyclic; reference counting frees them without the collector.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside the service's loop: the service, not uvicorn, owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """An ASGI app of a service's own (the approval console), served by uvicorn in the service's
    loop beside its health endpoints: `bind()` takes the port (0: a free one) and says which,
    `start(app)` returns once it serves."""

    def __init__(self, host: str, port: int, *, name: str, grace: int = 3) -> None:
        self._host = host
        self.port = port
        self._name = name
        self._grace = grace
        self._socket: socket.socket | None = None
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    def bind(self) -> int:
        self._socket = socket.create_server((self._host, self.port))
        self.port = self._socket.getsockname()[1]
        return self.port

    async def start(self, app: Any) -> None:
        sock = self._socket if self._socket is not None else socket.create_server((self._host, self.port))
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=self._grace,  # open event streams end at the latest then
        )
        self._server = server = _EmbeddedServer(config)
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name=f"{self._name}-http")
        while not server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError(f"the {self._name} HTTP server stopped before it started")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            try:
                await asyncio.wait_for(self._task, self._grace + 5)
            except Exception:
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
        if self._socket is not None:
            self._socket.close()


async def serve(service: Service, settings: Settings) -> None:
    """Start the service and its HTTP endpoints; stop both on SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    config = uvicorn.Config(
        health_app(service),
        host=settings.http_host,
        port=settings.http_port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    server = _EmbeddedServer(config)
    # An inherited listening socket (TOOLBUS_HTTP_FD) is served as it is: its port is already bound.
    sockets = None if settings.http_fd is None else [socket.socket(fileno=settings.http_fd)]
    http = asyncio.create_task(server.serve(sockets=sockets))
    await service.start()
    tune_gc()
    port = settings.http_port if sockets is None else sockets[0].getsockname()[1]
    log.info("service started", extra={"service": service.name, "http_port": port})
    await stop.wait()
    log.info("service stopping", extra={"service": service.name})
    with contextlib.suppress(Exception):
        await service.stop()
    server.should_exit = True
    await http


def run_service(build: Callable[[Settings], Awaitable[Service]]) -> None:
    """Entry point of `python -m toolbus_<name>`: settings from the environment, uvloop, serve."""
    settings = Settings()
    configure(settings.log_level, settings.log_format)
    for secret in (settings.secret_key, settings.webhook_secret):
        if secret is not None:
            for part in secret.get_secret_value().split(","):
                register_secret(part.strip())

    async def main() -> None:
        await serve(await build(settings), settings)

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:  # pragma: no cover - uvloop is a dependency; stay runnable without it
        asyncio.run(main())
