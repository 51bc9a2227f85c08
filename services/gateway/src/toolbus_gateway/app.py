"""The gateway assembled: NATS (a client of the registry and dispatcher, and the server of
`tokens.*`), Redis (tokens), the toolsets object store (read only), the MCP endpoint on its own
port, and the sweeper that closes idle runs."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import uvicorn
from redis.asyncio import Redis
from toolbus_common.bus import Bus, asyncapi_document
from toolbus_common.connections import JsPlacement, connect_redis
from toolbus_common.settings import Settings
from toolbus_common.tasks import cancel_and_wait
from toolbus_common.toolsets import ToolsetStore

from toolbus_gateway.auth import Authenticator
from toolbus_gateway.calls import Calls
from toolbus_gateway.catalogue import Catalogues
from toolbus_gateway.gateway import Gateway
from toolbus_gateway.handlers import routes
from toolbus_gateway.mcp_server import build_app
from toolbus_gateway.requests import Requester
from toolbus_gateway.runs import Runs
from toolbus_gateway.settings import GatewaySettings
from toolbus_gateway.tokens import TokenStore

log = logging.getLogger(__name__)

QUEUE = "toolbus-gateway"


class PortTaken(Exception):
    """The MCP port cannot be bound (another program listens on it): said in one line, no trace."""


class _Server(uvicorn.Server):
    """uvicorn inside the service's loop: the service owns the signals."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        return

    def capture_signals(self) -> Any:  # uvicorn >= 0.29
        import contextlib

        return contextlib.nullcontext()


class GatewayApp:
    """The running service (`toolbus_common.runtime.Service`)."""

    name = "gateway"

    def __init__(self, settings: Settings, gateway_settings: GatewaySettings | None = None) -> None:
        self.settings = settings
        self.gateway_settings = gateway_settings or GatewaySettings()
        self.bus = Bus(settings, name="gateway", queue=QUEUE)
        self._redis: Redis[bytes] | None = None
        self._http: _Server | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self.runs: Runs | None = None
        self.gateway: Gateway | None = None
        self.port: int | None = None
        self._ready = False

    @property
    def url(self) -> str:
        return f"http://{self.gateway_settings.host}:{self.port}"

    async def start(self) -> None:
        s, g = self.settings, self.gateway_settings
        try:  # first: a taken port stops the start before anything is opened
            self._socket = sock = socket.create_server((g.host, g.port), reuse_port=False)
        except OSError as exc:
            raise PortTaken(
                f"the gateway's MCP port {g.host}:{g.port} (TOOLBUS_GATEWAY_PORT) cannot be bound: "
                f"{exc.strerror or exc}"
            ) from None
        self.port = sock.getsockname()[1]
        nc = await self.bus.connect()
        js = nc.jetstream()
        self._redis = redis = connect_redis(s)
        tokens = TokenStore(redis, s.key_prefix, cache_seconds=g.token_cache_seconds)
        store = ToolsetStore(js, s.js_name("toolsets"), placement=JsPlacement.of(s))
        await store.open()
        requester = Requester(nc)
        calls = Calls(
            requester,
            js,
            s.subjects,
            watch_interval=g.watch_interval_seconds,
            call_timeout=g.call_timeout_seconds,
        )
        self.runs = Runs(calls, idle=g.run_idle_seconds)
        servers = [a.strip() for a in (g.authorization_servers or g.jwt_issuer or "").split(",") if a.strip()]
        base_url = (g.public_url or self.url).rstrip("/")
        self.gateway = Gateway(
            Authenticator.from_settings(tokens, g),
            Catalogues(store),
            calls,
            self.runs,
            requester,
            s.subjects,
            page_size=g.page_size,
            large_toolset=g.large_toolset,
            reconnect_url=g.reconnect_url,
            authorization_servers=servers,
        )
        self.bus.include(routes, tokens)
        await self.bus.start()
        app = build_app(self.gateway, base_url=base_url, max_body=g.max_body_bytes, host=g.host)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        self._http = server = _Server(config)
        self._http_task = asyncio.create_task(server.serve(sockets=[sock]), name="gateway-http")
        while not server.started:
            if self._http_task.done():
                self._http_task.result()
                raise RuntimeError("the gateway's HTTP server stopped before it started")
            await asyncio.sleep(0.01)
        self._sweeper = asyncio.create_task(self._sweep(), name="gateway-runs-sweeper")
        log.info("gateway serving MCP", extra={"url": f"{base_url}/mcp/<toolsetId>"})
        self._ready = True

    async def _sweep(self) -> None:
        assert self.runs is not None
        interval = min(60.0, max(0.5, self.gateway_settings.run_idle_seconds / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.runs.close_idle()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("idle-run sweep failed", extra={"error": type(exc).__name__})

    async def stop(self) -> None:
        self._ready = False
        if self._http is not None:
            self._http.should_exit = True
        if self._http_task is not None:
            try:
                await asyncio.wait_for(self._http_task, 10)
            except Exception:
                await cancel_and_wait(self._http_task)
        if self._socket is not None:
            self._socket.close()
        if self._sweeper is not None:
            await cancel_and_wait(self._sweeper)
        if self.runs is not None:
            await self.runs.close_all()
        await self.bus.drain()
        await self.bus.close()
        if self._redis is not None:
            await self._redis.aclose()  # type: ignore[attr-defined]

    def ready(self) -> bool:
        return self._ready and self.bus.ready()

    def asyncapi(self) -> dict[str, Any]:
        return asyncapi_document(self.settings, [routes], title="toolbus gateway")


async def build(settings: Settings) -> GatewayApp:
    """The app factory `run_service` calls: settings are read here, not at import."""
    return GatewayApp(settings, GatewaySettings())
