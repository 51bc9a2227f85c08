"""A token expiring mid-run, end to end: the registry, the dispatcher and the credentials service
as processes, a real MCP server over streamable HTTP that rotates the token it accepts, and a real
webhook receiver.

Proves: the call that meets the 401 parks (no attempt spent, no slot held); one signed
`credentials.expired` webhook and event name it; the parked call survives a restart of the
credentials service and a `kill -9` of the dispatcher; setting new credentials at the same level
and scope sends it again with the same idempotency key and it completes; the server ran it once;
and no token value appears in any reply, event, webhook, log line or Redis value. Prints the run's
event log (pytest `-s`).
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from standardwebhooks import Webhook
from toolbus_contracts import Subjects

from tests.support.bus_modes import Bus
from tests.support.events import stored_events
from tests.support.infra import js_name, request, until
from tests.support.mcp_servers import McpTestServer
from tests.support.webhooks import Receiver, webhook_receiver

pytestmark = pytest.mark.e2e

OLD = "tok-old-" + secrets.token_hex(12)
NEW = "tok-new-" + secrets.token_hex(12)
WEBHOOK_SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class Harness:
    """What a harness sees: replies (all kept, to search for secrets) and the run's events."""

    def __init__(self, nc: Any, prefix: str) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.prefix = prefix
        self.subjects = Subjects(prefix)
        self.replies: list[dict[str, Any]] = []
        self.expired_events: list[dict[str, Any]] = []

    async def ok(self, subject: str, body: dict[str, Any], within: float = 15.0) -> dict[str, Any]:
        reply = await request(self.nc, subject, body, timeout=within)
        self.replies.append(reply)
        assert reply["ok"] is True, reply
        data: dict[str, Any] = reply["data"]
        return data

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        return await stored_events(self.nc, js_name(self.prefix, "EVENTS"), self.subjects.run_events(run_id))

    async def kinds(self, run_id: str, call_id: str) -> list[str]:
        return [e["type"] for e in await self.events(run_id) if e["callId"] == call_id]


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def receiver(bus: Bus) -> AsyncIterator[Receiver]:
    """One receiver per mode (each mode's test counts the webhooks it sent)."""
    async with webhook_receiver() as rec:
        yield rec


@pytest.fixture(scope="module")
def env(service_env: dict[str, str], receiver: Receiver, bus: Bus) -> dict[str, str]:
    prefix = bus.prefix("tbcr")
    return {
        **service_env,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_REDIS_PREFIX": prefix,
        "TOOLBUS_WEBHOOK_URL": receiver.url,
        "TOOLBUS_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "TOOLBUS_WEBHOOK_RETRY_SCHEDULE": "100ms,200ms",
        "TOOLBUS_PARK_NOTIFY_DELAY": "100ms",
        "TOOLBUS_DISPATCHER_LEASE": "2",
        "TOOLBUS_LOG_FORMAT": "json",
    }


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def harness(env: dict[str, str], bus: Bus, redis_url: str) -> AsyncIterator[Harness]:
    prefix = env["TOOLBUS_SUBJECT_PREFIX"]
    nc = await bus.connect("harness")
    h = Harness(nc, prefix)

    async def on_expired(msg: Any) -> None:
        h.expired_events.append(json.loads(msg.data))

    sub = await nc.subscribe(h.subjects.credentials_expired, cb=on_expired)
    try:
        yield h
    finally:
        await sub.unsubscribe()
        await bus.drop_state(nc, redis_url, prefix)
        await nc.drain()


def bearer(token: str) -> dict[str, Any]:
    return {"servers": {"crm": {"headers": {"Authorization": f"Bearer {token}"}}}}


async def test_a_call_parked_on_an_expired_token_completes_once_after_new_credentials(
    env: dict[str, str], harness: Harness, receiver: Receiver, redis_url: str, bus: Bus
) -> None:
    h = harness
    logs: list[Path] = []
    async with (
        McpTestServer(name="crm", required_token=OLD) as server,
        bus.service("registry", env) as reg,
    ):
        logs.append(reg.log_path)
        credentials = await _start(bus.service("credentials", env), logs)
        dispatcher = await _start(bus.service("dispatcher", env), logs)
        try:
            toolset = await h.ok(
                h.subjects.toolsets_create,
                {"mcp": [{"name": "crm", "url": server.url}], "credentials": bearer(OLD)},
                within=30,
            )
            run = await h.ok(h.subjects.runs_open, {"toolsetId": toolset["id"], "namespace": "user-42"})
            run_id = run["runId"]

            first = await h.ok(
                h.subjects.calls_invoke, {"runId": run_id, "tool": "crm.echo", "input": {"text": "before"}}
            )
            assert first["outcome"]["status"] == "ok"

            # The token expires: the server now accepts only NEW.
            server.required_token = NEW
            started = await h.ok(
                h.subjects.calls_start,
                {
                    "runId": run_id,
                    "tool": "crm.echo",
                    "input": {"text": "after"},
                    "idempotencyKey": "k-rotate-1",
                },
            )
            call_id = started["callId"]

            async def parked() -> bool:
                got = await h.ok(h.subjects.calls_get, {"callId": call_id})
                return bool(got["state"] == "parked")

            await until(parked, "the call parks", limit=20)
            await until(lambda: len(receiver.received) >= 1, "the credentials.expired webhook", limit=20)

            # One signed webhook, naming the server, level, scope and the parked call.
            headers, raw = receiver.received[0]
            payload = Webhook(WEBHOOK_SECRET).verify(raw, headers)
            assert payload["type"] == "credentials.expired"
            assert payload["data"] == {
                "toolsetId": toolset["id"],
                "namespace": None,
                "runId": None,
                "server": "crm",
                "level": "toolset",
                "callIds": [call_id],
            }
            await until(lambda: len(h.expired_events) == 1, "the credentials.expired event")
            assert h.expired_events[0] == json.loads(raw)
            got = await h.ok(h.subjects.calls_get, {"callId": call_id})
            assert got == {"callId": call_id, "state": "parked", "attempts": 0}

            # Parked calls survive a restart of the credentials service and a crash of the dispatcher.
            await credentials.__aexit__(None, None, None)
            dispatcher.kill()
            await dispatcher.__aexit__(None, None, None)
            credentials = await _start(bus.service("credentials", env), logs)
            dispatcher = await _start(bus.service("dispatcher", env), logs)
            assert (await h.ok(h.subjects.calls_get, {"callId": call_id}))["state"] == "parked"

            # New credentials at the same level and scope send the call again, with the same key.
            assert await h.ok(
                h.subjects.toolsets_credentials_set, {"toolsetId": toolset["id"], "credentials": bearer(NEW)}
            ) == {"level": "toolset"}
            done = await h.ok(
                h.subjects.calls_invoke,
                {
                    "runId": run_id,
                    "tool": "crm.echo",
                    "input": {"text": "after"},
                    "idempotencyKey": "k-rotate-1",
                },
                within=30,
            )
            assert done["callId"] == call_id
            assert done["outcome"]["status"] == "ok"

            seen = server.calls_to("echo")
            mine = [c for c in seen if c.idempotency_key_header == "k-rotate-1"]
            assert [c.authorized for c in mine] == [False, True]  # the 401, then the one real run
            assert all(c.idempotency_key_meta == "k-rotate-1" for c in mine)
            assert sum(1 for c in seen if c.authorized and c.arguments == {"text": "after"}) == 1

            await until(lambda: _ends_with(h, run_id, call_id, "completed"), "the completed event", limit=10)
            events = [e for e in await h.events(run_id) if e["callId"] == call_id]
            kinds = [e["type"] for e in events]
            assert kinds == ["accepted", "attemptStarted", "parked", "resumed", "attemptStarted", "completed"]
            assert events[2]["server"] == "crm" and events[2]["level"] == "toolset"
            assert len(receiver.received) == 1  # once per level and scope, not once per call
            print("\nrotation: events of the parked call")
            for e in events:
                extra = {k: v for k, v in e.items() if k not in ("type", "callId", "runId", "at")}
                print(f"  {e['at']}  {e['type']:<15} {json.dumps(extra) if extra else ''}")
            print(f"  webhook credentials.expired, webhook-id {headers['webhook-id']}: {payload['data']}")

            await h.ok(h.subjects.runs_close, {"runId": run_id})
        finally:
            await dispatcher.__aexit__(None, None, None)
            await credentials.__aexit__(None, None, None)

    # No token value in any reply, event, webhook, log line or Redis value.
    everything = [json.dumps(h.replies), json.dumps(h.expired_events), json.dumps(await h.events(run_id))]
    everything += [raw.decode() + json.dumps(hdrs) for hdrs, raw in receiver.received]
    everything += [p.read_text(errors="replace") for p in logs if p.exists()]
    for token in (OLD, NEW):
        assert all(token not in text for text in everything)
    from redis.asyncio import Redis

    redis = Redis.from_url(redis_url)
    try:
        async for key in redis.scan_iter(match=f"{env['TOOLBUS_REDIS_PREFIX']}:*", count=500):
            kind = (await redis.type(key)).decode()  # type: ignore[no-untyped-call]  # types-redis 4.6 leaves it unannotated
            values: list[bytes] = []
            if kind == "string":
                values = [await redis.get(key) or b""]
            elif kind == "hash":
                values = list((await redis.hgetall(key)).values())
            elif kind == "list":
                values = await redis.lrange(key, 0, -1)
            elif kind == "zset":
                values = await redis.zrange(key, 0, -1)
            elif kind == "set":
                values = list(await redis.smembers(key))
            for value in values:
                assert OLD.encode() not in value and NEW.encode() not in value, key
    finally:
        await redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag


async def test_credentials_set_right_on_the_parked_event_resume_the_call(
    env: dict[str, str], harness: Harness, redis_url: str, bus: Bus
) -> None:
    """The SDK walkthrough's race: the user sets new credentials the moment the `parked` event
    arrives, which can reach the credentials service before the park command does. The call must
    still be sent again (same idempotency key) and complete."""
    import asyncio

    h = harness
    logs: list[Path] = []
    old, new = "tok-old-" + secrets.token_hex(12), "tok-new-" + secrets.token_hex(12)
    async with (
        McpTestServer(name="crm", required_token=old) as server,
        bus.service("registry", env) as reg,
    ):
        logs.append(reg.log_path)
        credentials = await _start(bus.service("credentials", env), logs)
        dispatcher = await _start(bus.service("dispatcher", env), logs)
        try:
            toolset = await h.ok(
                h.subjects.toolsets_create,
                {"mcp": [{"name": "crm", "url": server.url}], "credentials": bearer(old)},
                within=30,
            )
            run_id = (await h.ok(h.subjects.runs_open, {"toolsetId": toolset["id"]}))["runId"]
            server.required_token = new  # the token expires
            sets: list[asyncio.Task[dict[str, Any]]] = []

            async def on_event(msg: Any) -> None:
                if json.loads(msg.data)["type"] == "parked" and not sets:
                    sets.append(
                        asyncio.create_task(
                            h.ok(
                                h.subjects.toolsets_credentials_set,
                                {"toolsetId": toolset["id"], "credentials": bearer(new)},
                            )
                        )
                    )

            sub = await h.nc.subscribe(h.subjects.run_events(run_id), cb=on_event)
            try:
                start = {
                    "runId": run_id,
                    "tool": "crm.echo",
                    "input": {"text": "x"},
                    "idempotencyKey": "k-race",
                }
                call_id = (await h.ok(h.subjects.calls_start, start))["callId"]
                await until(lambda: bool(sets), "the parked event", limit=20)
                assert await sets[0] == {"level": "toolset"}
                done = await h.ok(h.subjects.calls_invoke, start, within=30)
            finally:
                await sub.unsubscribe()
            assert done["callId"] == call_id
            assert done["outcome"]["status"] == "ok"
            mine = [c for c in server.calls_to("echo") if c.idempotency_key_header == "k-race"]
            assert sum(1 for c in mine if c.authorized) == 1  # ran once, with the new token
            # Whichever reached the credentials service first: the park names the version its
            # headers were resolved at, and the set recorded a newer one at that scope, so a park
            # recorded after the set is resumed at once (the deterministic form of this race is
            # in tests/credentials/test_credentials_service.py).
            # The park commands, read from the INTERNAL stream as the credentials service (the
            # harness may not read INTERNAL).
            internal = await internal_messages(bus, h.prefix, h.subjects.internal_calls_park)
            parks = [p for p in internal if p["callId"] == call_id]
            assert len(parks) == 1  # parked once
            from redis.asyncio import Redis
            from toolbus_common.keys import Keys

            redis = Redis.from_url(redis_url)
            try:
                key = Keys(env["TOOLBUS_REDIS_PREFIX"]).credentials_set_version("toolset", toolset["id"])
                assert int(await redis.get(key) or 0) > parks[0]["credentialsVersion"]
            finally:
                await redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
            await h.ok(h.subjects.runs_close, {"runId": run_id})
        finally:
            await dispatcher.__aexit__(None, None, None)
            await credentials.__aexit__(None, None, None)


async def internal_messages(bus: Bus, prefix: str, subject: str) -> list[dict[str, Any]]:
    """Every message now on `subject` in the INTERNAL stream, read as the credentials service."""
    nc = await bus.connect("credentials")
    try:
        sub = await nc.jetstream().subscribe(
            subject, stream=js_name(prefix, "INTERNAL"), ordered_consumer=True
        )
        out: list[dict[str, Any]] = []
        while True:
            try:
                msg = await sub.next_msg(timeout=5)
            except Exception:
                return out
            out.append(json.loads(msg.data))
            if msg.metadata.num_pending == 0:
                return out
    finally:
        await nc.close()


async def _ends_with(h: Harness, run_id: str, call_id: str, last: str) -> bool:
    kinds = await h.kinds(run_id, call_id)
    return bool(kinds) and kinds[-1] == last


class _Running:
    """An `aservice_process` context entered by hand, so a test can stop and restart it."""

    def __init__(self, cm: Any) -> None:
        self._cm = cm
        self._svc: Any = None
        self._open = False

    async def enter(self) -> _Running:
        self._svc = await self._cm.__aenter__()
        self._open = True
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self._svc.kill()

    async def __aexit__(self, *exc: object) -> None:
        if self._open:
            self._open = False
            await self._cm.__aexit__(None, None, None)


async def _start(cm: Any, logs: list[Path]) -> _Running:
    running = await _Running(cm).enter()
    logs.append(running._svc.log_path)
    return running
