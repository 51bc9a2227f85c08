"""OAuth connections from the harness's side: `credentials.connect` at a level, the handle it
returns (`authorization_url`, `await conn.wait()`), status and disconnect."""

from __future__ import annotations

import asyncio
from typing import Any

from toolbus_contracts.credentials import (
    CredentialsConnected,
    CredentialsConnectFailed,
    CredentialsConnectReply,
    CredentialsConnectRequest,
    CredentialsDisconnectReply,
    CredentialsDisconnectRequest,
    CredentialsStatusReply,
    CredentialsStatusRequest,
)

from toolbus._core import Core, build
from toolbus._errors import InvalidRequest, Timeout
from toolbus._feeds import Feed


class Connection:
    """A connection being made: send the end user to `authorization_url`; `await wait()` returns
    the `credentials.connected` event's data once they consented, or raises `InvalidRequest`
    (`details.error`: `access_denied`, ...) when the attempt failed."""

    def __init__(
        self,
        reply: CredentialsConnectReply,
        connected: Feed[CredentialsConnected],
        failed: Feed[CredentialsConnectFailed],
    ) -> None:
        self.id = reply.connection_id
        self.level = reply.level
        self.status = reply.status
        self.authorization_url = reply.authorization_url
        self.expires_at = reply.expires_at
        self._connected = connected
        self._failed = failed

    async def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Until the end user connected (the event's data) or the attempt failed."""
        try:
            if self.status == "connected":
                return {"connectionId": self.id, "level": self.level}
            ok = asyncio.ensure_future(self._connected.next(timeout))
            bad = asyncio.ensure_future(self._failed.next(timeout))
            done, pending = await asyncio.wait({ok, bad}, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            if ok in done:
                return ok.result().data.model_dump(mode="json", by_alias=True)
            if bad in done:
                failure = bad.result().data  # Timeout propagates from here too
                raise InvalidRequest(
                    f"The connection failed: {failure.error} ({failure.message}).",
                    details={"error": failure.error, "connectionId": self.id},
                )
            raise Timeout(f"No connection within {timeout:g}s.")
        finally:
            await self.close()

    async def close(self) -> None:
        await self._connected.close()
        await self._failed.close()


class Connections:
    """`credentials.connect` / `.status` / `.disconnect` for any level; `tb.namespaces.connect`,
    `tb.toolsets.connect` and `run.connect` call this."""

    def __init__(self, tb: Core) -> None:
        self._tb = tb

    async def connect(self, server: str, **target: Any) -> Connection:
        body = build(CredentialsConnectRequest, server=server, **target)
        subjects = self._tb.subjects
        # Subscribed before the request: the event may come right after the reply. The id is known
        # only from the reply; no event of this connection can come before it (the user needs the URL).
        wanted: list[str] = []
        connected = await Feed.open(
            self._tb,
            subjects.credentials_connected,
            CredentialsConnected,
            lambda e: e.data.connection_id in wanted,
        )
        failed = await Feed.open(
            self._tb,
            subjects.credentials_failed,
            CredentialsConnectFailed,
            lambda e: e.data.connection_id in wanted,
        )
        try:
            reply = CredentialsConnectReply.model_validate(
                await self._tb.request(subjects.credentials_connect, body, timeout=30)
            )
        except BaseException:
            await connected.close()
            await failed.close()
            raise
        wanted.append(reply.connection_id)
        return Connection(reply, connected, failed)

    async def status(self, **target: Any) -> CredentialsStatusReply:
        body = build(CredentialsStatusRequest, **target)
        return CredentialsStatusReply.model_validate(
            await self._tb.request(self._tb.subjects.credentials_status, body, retry=True)
        )

    async def disconnect(self, server: str, **target: Any) -> CredentialsDisconnectReply:
        body = build(CredentialsDisconnectRequest, server=server, **target)
        return CredentialsDisconnectReply.model_validate(
            await self._tb.request(self._tb.subjects.credentials_disconnect, body)
        )
