"""The walkthrough's MCP server: a tiny CRM over streamable HTTP, behind a bearer token that can be
rotated while it runs (to show a call parked on an expired credential).

    server = CrmServer(token="tok-1").start()     # server.url; server.token = "tok-2" rotates it
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

INVOICES = {"inv_1": {"id": "inv_1", "customer": "ada@example.com", "amount": 4200, "status": "paid"}}


def build_mcp() -> MCPServer:
    mcp = MCPServer("crm", log_level="WARNING")

    @mcp.tool()
    def find_invoice(invoice_id: str) -> dict[str, Any]:
        """Find an invoice by id."""
        return INVOICES.get(invoice_id, {"id": invoice_id, "status": "unknown"})

    @mcp.tool()
    def refund(invoice_id: str, amount: int) -> dict[str, Any]:
        """Refund part or all of an invoice. Needs approval."""
        return {"refundId": f"re_{invoice_id}_{amount}", "amount": amount}

    return mcp


class CrmServer:
    """The CRM MCP server on a free 127.0.0.1 port, in a thread of its own."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _guarded(self, app: Any) -> Any:
        async def guard(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                headers = dict(scope.get("headers") or [])
                if headers.get(b"authorization", b"").decode() != f"Bearer {self.token}":
                    await send(
                        {"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"0")]}
                    )
                    await send({"type": "http.response.body", "body": b""})
                    return
            await app(scope, receive, send)

        return guard

    def start(self) -> CrmServer:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._guarded(build_mcp().streamable_http_app(stateless_http=True)),
            log_level="warning",
            lifespan="on",
        )
        self._server = uvicorn.Server(config)
        server = self._server

        def serve() -> None:
            asyncio.run(server.serve(sockets=[sock]))

        self._thread = threading.Thread(target=serve, name="crm-mcp", daemon=True)
        self._thread.start()
        while not server.started:
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(10)
