"""A real HTTP webhook receiver for tests, and a bounded wait helper."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.infra import free_port


@dataclass
class Receiver:
    """Records every delivery (lower-cased headers, raw body); answers the queued `statuses`, then
    204, after `delay` seconds."""

    url: str = ""
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    delay: float = 0.0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        self.received.append(({k.lower(): v for k, v in request.headers.items()}, body))
        self.arrived.set()
        if self.delay:
            await asyncio.sleep(self.delay)
        return Response(status_code=self.statuses.pop(0) if self.statuses else 204)


@contextlib.asynccontextmanager
async def webhook_receiver() -> AsyncIterator[Receiver]:
    """Serve a `Receiver` on a free 127.0.0.1 port at `/hook` for the duration of the block."""
    rec = Receiver()
    port = free_port()
    app = Starlette(routes=[Route("/hook", rec.handle, methods=["POST"])])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    rec.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield rec
    finally:
        server.should_exit = True
        await task
