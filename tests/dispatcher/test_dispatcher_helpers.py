"""Helpers for the dispatcher's tests: an in-process dispatcher on its own prefix, pinned toolsets
written straight into the toolset store, and raw request/reply. (No tests in this module.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis
from toolbus_common.canonical import content_id
from toolbus_common.keys import Keys
from toolbus_common.toolsets import ToolsetStore
from toolbus_contracts import PinnedToolset, Subjects
from toolbus_devstack import DEV_EGRESS_ALLOW
from toolbus_dispatcher.app import DispatcherApp
from toolbus_dispatcher.credentials import CredentialResolver
from toolbus_dispatcher.settings import DispatcherSettings

from tests.support.commands import TEST_SECRET_KEY
from tests.support.infra import js_name, unique_prefix, until

FAST = {
    "egress_allow": DEV_EGRESS_ALLOW,  # its MCP and HTTP servers listen on loopback
    "dispatcher_lease": 1.5,
    "dispatcher_retry_backoff": 0.02,
    "dispatcher_retry_backoff_max": 0.1,
}


def echo_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def host_tool(name: str, **policy: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "inputSchema": {"type": "object"}}
    if policy:
        spec["policy"] = policy
    return spec


class Harness:
    """One dispatcher (or more) on a prefix of its own, and a client connection."""

    def __init__(
        self,
        nats_url: str,
        redis_url: str,
        *,
        prefix: str | None = None,
        connect_options: dict[str, Any] | None = None,
        store_connect_options: dict[str, Any] | None = None,
    ) -> None:
        """`connect_options` (nats.connect's) for the client connection, `store_connect_options`
        for a second one that writes the toolsets store (on a secured server: the registry's
        user; the harness's may not). Without them, plain connections to `nats_url`."""
        self.nats_url = nats_url
        self.redis_url = redis_url
        self.prefix = prefix or unique_prefix("tbd")
        self.connect_options = connect_options or {"servers": [nats_url]}
        self.store_connect_options = store_connect_options
        self.store_nc: NatsClient | None = None
        self.subjects = Subjects(self.prefix)
        self.keys = Keys(self.prefix)
        self.apps: list[DispatcherApp] = []
        self.nc: NatsClient | None = None
        self.store: ToolsetStore | None = None
        self.redis: Redis[bytes] | None = None

    def settings(self, **overrides: Any) -> DispatcherSettings:
        values: dict[str, Any] = {
            "nats_url": self.nats_url,
            "redis_url": self.redis_url,
            "subject_prefix": self.prefix,
            "secret_key": TEST_SECRET_KEY,
            **FAST,
            **overrides,
        }
        return DispatcherSettings(**values)

    def env(self, **overrides: str) -> dict[str, str]:
        """Environment for a dispatcher subprocess on this harness's prefix."""
        return {
            "TOOLBUS_NATS_URL": self.nats_url,
            "TOOLBUS_REDIS_URL": self.redis_url,
            "TOOLBUS_SUBJECT_PREFIX": self.prefix,
            "TOOLBUS_SECRET_KEY": TEST_SECRET_KEY,
            "TOOLBUS_DISPATCHER_LEASE": str(FAST["dispatcher_lease"]),
            "TOOLBUS_DISPATCHER_RETRY_BACKOFF": str(FAST["dispatcher_retry_backoff"]),
            "TOOLBUS_DISPATCHER_RETRY_BACKOFF_MAX": str(FAST["dispatcher_retry_backoff_max"]),
            "TOOLBUS_LOG_LEVEL": "WARNING",
            **overrides,
        }

    async def connect(self) -> None:
        self.nc = await nats.connect(**self.connect_options)
        store_nc = self.nc
        if self.store_connect_options is not None:
            self.store_nc = store_nc = await nats.connect(**self.store_connect_options)
        self.store = ToolsetStore(store_nc.jetstream(), js_name(self.prefix, "toolsets"))
        await self.store.open()
        self.redis = Redis.from_url(self.redis_url)

    async def dispatcher(
        self, credentials: CredentialResolver | None = None, resolver: Any = None, **overrides: Any
    ) -> DispatcherApp:
        app = DispatcherApp(self.settings(**overrides), credentials=credentials, http_resolver=resolver)
        await app.start()
        self.apps.append(app)
        return app

    async def close(self) -> None:
        for app in self.apps:
            with contextlib.suppress(Exception):
                await app.stop(grace=1.0)
        if self.store_nc is not None:
            await self.store_nc.drain()
        if self.nc is not None and self.store_connect_options is not None:
            # A secured server of the test's own: no user there may delete streams, nor needs to.
            await self.nc.drain()
        elif self.nc is not None:
            js = self.nc.jetstream()
            for name in (
                "EVENTS",
                "INTERNAL",
                "OBJ_" + js_name(self.prefix, "toolsets"),
                "OBJ_" + js_name(self.prefix, "outputs"),
            ):
                with contextlib.suppress(Exception):
                    await js.delete_stream(name if name.startswith("OBJ_") else js_name(self.prefix, name))
            await self.nc.drain()
        if self.redis is not None:
            keys = [k async for k in self.redis.scan_iter(match=f"{self.prefix}:*", count=500)]
            if keys:
                await self.redis.unlink(*keys)
            await self.redis.aclose()  # type: ignore[attr-defined]

    async def toolset(self, spec: dict[str, Any]) -> str:
        """Pin `spec` (PinnedToolset wire form) straight into the store; returns its id."""
        assert self.store is not None
        pinned = PinnedToolset.model_validate(spec)
        tid = content_id("ts_", pinned.model_dump(mode="json", exclude_none=True))
        await self.store.put(tid, pinned)
        return tid

    async def request(self, subject: str, body: Any, within: float = 10.0) -> dict[str, Any]:
        assert self.nc is not None
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        msg = await self.nc.request(subject, data, timeout=within)
        reply: dict[str, Any] = json.loads(msg.data)
        return reply

    async def ok(self, subject: str, body: Any, within: float = 10.0) -> dict[str, Any]:
        reply = await self.request(subject, body, within)
        assert reply["ok"], reply
        data: dict[str, Any] = reply["data"]
        return data

    async def open_run(self, toolset_id: str, **extra: Any) -> str:
        data = await self.ok(self.subjects.runs_open, {"toolsetId": toolset_id, **extra})
        run_id: str = data["runId"]
        return run_id

    async def invoke(self, run_id: str, tool: str, input: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return await self.ok(
            self.subjects.calls_invoke, {"runId": run_id, "tool": tool, "input": input, **extra}, within=30
        )

    async def wait_state(self, call_id: str, state: str, within: float = 15.0) -> dict[str, Any]:
        """Poll `calls.get` until the call is in `state` (bounded)."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            data = await self.ok(self.subjects.calls_get, {"callId": call_id})
            if data["state"] == state:
                return data
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"call {call_id} stayed {data['state']}, expected {state}")
            await asyncio.sleep(0.02)

    @contextlib.asynccontextmanager
    async def events(self, run_id: str) -> AsyncIterator[list[dict[str, Any]]]:
        """Collect the run's call events (core NATS) while the body runs."""
        assert self.nc is not None
        seen: list[dict[str, Any]] = []

        async def cb(msg: Any) -> None:
            seen.append(json.loads(msg.data))

        sub = await self.nc.subscribe(self.subjects.run_events(run_id), cb=cb)
        try:
            yield seen
        finally:
            await self.nc.flush()
            await sub.unsubscribe()

    async def first_internal(self, subject: str, field: str, value: str) -> dict[str, Any]:
        """The first message on an INTERNAL-stream `subject` whose body has `field == value` (read
        with an ordered consumer from the start of the stream)."""
        assert self.nc is not None
        sub = await self.nc.jetstream().subscribe(subject, ordered_consumer=True)
        try:
            while True:
                msg = await sub.next_msg(timeout=10)
                body: dict[str, Any] = json.loads(msg.data)
                if body[field] == value:
                    return body
        finally:
            await sub.unsubscribe()


async def wait_until(predicate: Any, within: float = 15.0, what: str = "condition") -> None:
    await until(predicate, what, limit=within)
