"""The credentials service in-process on real NATS JetStream and Redis: sets at three levels, bad
input, parking with one `credentials.expired` per scope and server, resume in park order, park
timeout, run close, restarts, and no secret anywhere."""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from standardwebhooks import Webhook
from toolbus_common.canonical import content_id
from toolbus_common.keys import Keys
from toolbus_common.logging import JsonFormatter
from toolbus_common.settings import Settings
from toolbus_common.toolsets import ToolsetStore
from toolbus_contracts import PinnedToolset, Subjects
from toolbus_contracts.credentials import CredentialLevel
from toolbus_contracts.internal import CallParked, RunClosed
from toolbus_contracts.registry import PinnedServer
from toolbus_credentials.app import CredentialsService
from toolbus_credentials.settings import CredentialsSettings

from tests.support.commands import TEST_SECRET_KEY, publish_command
from tests.support.infra import js_name, request, until
from tests.support.webhooks import Receiver
from tests.support.webhooks import webhook_receiver as receiver

pytestmark = pytest.mark.integration

SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
PINNED = PinnedToolset(
    servers=[
        PinnedServer(name="github", url="http://127.0.0.1:1/mcp", tools=[]),
        PinnedServer(name="stripe", url="http://127.0.0.1:1/mcp", tools=[]),
    ]
)
TS = content_id("ts_", PINNED.wire())  # the store refuses a toolset that is not under its own id
TOKEN = "tok-" + secrets.token_hex(16)


@dataclass
class Stack:
    """One isolated deployment (its own subject and key prefix) and what it published."""

    prefix: str
    settings: Settings
    own: CredentialsSettings
    subjects: Subjects
    keys: Keys
    receiver: Receiver
    seen: dict[str, list[bytes]] = field(default_factory=dict)
    replies: list[dict[str, Any]] = field(default_factory=list)
    service: CredentialsService | None = None

    def on(self, subject: str) -> list[dict[str, Any]]:
        return [json.loads(b) for b in self.seen.get(subject, [])]

    async def start(self) -> CredentialsService:
        self.service = CredentialsService(self.settings, self.own)
        await self.service.start()
        return self.service

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
            self.service = None


@pytest.fixture
async def stack(
    nc: Any, js: Any, nats_url: str, redis_url: str, prefix: str, redis_client: Any, request_: Any = None
) -> AsyncIterator[Stack]:
    sub_prefix = f"{prefix}.cr{secrets.token_hex(3)}"
    async with receiver() as rec:
        settings = Settings(
            nats_url=nats_url,
            redis_url=redis_url,
            subject_prefix=sub_prefix,
            redis_prefix=f"{prefix}:{sub_prefix}",
            secret_key=TEST_SECRET_KEY,
            webhook_url=rec.url,
            webhook_secret=SECRET,
        )
        own = CredentialsSettings(
            park_timeout="1h",
            park_sweep_interval="50ms",
            park_notify_delay="300ms",
            webhook_retry_schedule="50ms,50ms",
        )
        st = Stack(sub_prefix, settings, own, settings.subjects, Keys(settings.key_prefix), rec)

        async def capture(msg: Any) -> None:
            st.seen.setdefault(msg.subject, []).append(msg.data)

        sub = await nc.subscribe(f"{sub_prefix}.>", cb=capture)
        store = ToolsetStore(js, js_name(sub_prefix, "toolsets"))
        await store.open()
        await store.put(TS, PINNED)
        try:
            yield st
        finally:
            await st.stop()
            await sub.unsubscribe()


def body(**servers: str) -> dict[str, Any]:
    return {"servers": {name: {"headers": {"Authorization": f"Bearer {v}"}} for name, v in servers.items()}}


async def open_run(redis_client: Any, st: Stack, run_id: str, namespace: str | None = "user-1") -> None:
    await redis_client.hset(
        st.keys.run(run_id), mapping={"toolsetId": TS, "namespace": namespace or "", "state": "open"}
    )


async def call(nc: Any, st: Stack, subject: str, payload: dict[str, Any] | bytes) -> dict[str, Any]:
    reply = await request(nc, subject, payload)
    st.replies.append(reply)
    return reply


async def park(
    js: Any,
    st: Stack,
    call_id: str,
    *,
    level: CredentialLevel = "run",
    run_id: str = "run-1",
    server: str = "github",
    namespace: str | None = "user-1",
    credentials_version: int | None = None,
) -> None:
    message = CallParked(
        call_id=call_id,
        run_id=run_id,
        toolset_id=TS,
        namespace=namespace,
        server=server,
        level=level,
        parked_at="2026-11-30T00:00:00.000Z",
        credentials_version=credentials_version,
    )
    await publish_command(js, st.subjects.internal_calls_park, message.wire_json())


# ---- sets and bad input --------------------------------------------------------------------------


async def test_each_level_replies_its_level_and_resolves(nc: Any, redis_client: Any, stack: Stack) -> None:
    await stack.start()
    await open_run(redis_client, stack, "run-1")
    s = stack.subjects
    assert await call(
        nc, stack, s.toolsets_credentials_set, {"toolsetId": TS, "credentials": body(github="t")}
    ) == {"ok": True, "data": {"level": "toolset"}}
    assert await call(
        nc,
        stack,
        s.namespaces_credentials_set,
        {"namespace": "user-1", "toolsetId": TS, "credentials": body(github="n")},
    ) == {"ok": True, "data": {"level": "namespace"}}
    assert await call(
        nc, stack, s.runs_credentials_set, {"runId": "run-1", "credentials": body(stripe="r")}
    ) == {"ok": True, "data": {"level": "run"}}
    assert stack.service is not None and stack.service.logic is not None
    store = stack.service.logic.store
    github = await store.resolve(toolset_id=TS, namespace="user-1", run_id="run-1", server="github")
    stripe = await store.resolve(toolset_id=TS, namespace="user-1", run_id="run-1", server="stripe")
    assert (github.level, github.headers) == ("namespace", {"Authorization": "Bearer n"})
    assert (stripe.level, stripe.headers) == ("run", {"Authorization": "Bearer r"})
    await until(lambda: len(stack.on(s.internal_credentials_changed)) == 3, "three CredentialsChanged")
    assert [m["level"] for m in stack.on(s.internal_credentials_changed)] == ["toolset", "namespace", "run"]


@pytest.mark.parametrize(
    ("which", "payload", "code", "field_"),
    [
        ("toolset", {"toolsetId": "ts_" + "0" * 64, "credentials": body(github="x")}, "notFound", None),
        ("run", {"runId": "no-such-run", "credentials": body(github="x")}, "notFound", None),
        ("toolset", {"toolsetId": "ts_nope", "credentials": body(github="x")}, "invalidRequest", "toolsetId"),
        (
            "toolset",
            {"toolsetId": "x" * 600_000, "credentials": body(github="x")},
            "invalidRequest",
            "toolsetId",
        ),
        (
            "namespace",
            {"toolsetId": "*", "namespace": "u", "credentials": body(github="x")},
            "invalidRequest",
            "toolsetId",
        ),
        (
            "toolset",
            {"toolsetId": TS, "credentials": body(gitlab="x")},
            "invalidRequest",
            "credentials.servers.gitlab",
        ),
        ("toolset", {"toolsetId": TS}, "invalidRequest", "credentials"),
        (
            "toolset",
            {"toolsetId": TS, "credentials": {"servers": {"github": {"headers": {}}}}},
            "invalidRequest",
            "credentials.servers.github.headers",
        ),
        (
            "toolset",
            {"toolsetId": TS, "credentials": {"servers": {"github": {"headers": {"Host": "x"}}}}},
            "invalidRequest",
            "credentials.servers.github.headers",
        ),
        (
            "toolset",
            {"toolsetId": TS, "credentials": {"servers": {"github": {"headers": {"A b": "x"}}}}},
            "invalidRequest",
            "credentials.servers.github.headers",
        ),
        (
            "toolset",
            {"toolsetId": TS, "credentials": {"servers": {"github": {"headers": {"A": "x\r\nB: y"}}}}},
            "invalidRequest",
            "credentials.servers.github.headers.A",
        ),
        (
            "toolset",
            {"toolsetId": TS, "credentials": {"servers": {"github": {"headers": {"A": 5}}}}},
            "invalidRequest",
            "credentials.servers.github.headers.A",
        ),
        (
            "toolset",
            {"toolsetId": TS, "credentials": {"servers": []}},
            "invalidRequest",
            "credentials.servers",
        ),
        (
            "toolset",
            {"toolsetId": TS, "credentials": body(github="x"), "extra": 1},
            "invalidRequest",
            "extra",
        ),
        (
            "namespace",
            {"toolsetId": TS, "namespace": "", "credentials": body(github="x")},
            "invalidRequest",
            "namespace",
        ),
        (
            "namespace",
            {"toolsetId": "ts_" + "0" * 64, "namespace": "u", "credentials": body(github="x")},
            "notFound",
            None,
        ),
    ],
)
async def test_bad_requests_are_refused_naming_the_field(
    nc: Any, stack: Stack, which: str, payload: dict[str, Any], code: str, field_: str | None
) -> None:
    await stack.start()
    subject = {
        "toolset": stack.subjects.toolsets_credentials_set,
        "run": stack.subjects.runs_credentials_set,
        "namespace": stack.subjects.namespaces_credentials_set,
    }[which]
    reply = await call(nc, stack, subject, payload)
    assert reply["ok"] is False
    assert reply["error"]["code"] == code
    if field_ is not None:
        assert reply["error"]["details"]["field"].startswith(field_)


async def test_malformed_json_and_closed_runs_are_refused(nc: Any, redis_client: Any, stack: Stack) -> None:
    await stack.start()
    reply = await call(nc, stack, stack.subjects.toolsets_credentials_set, b"{not json")
    assert reply["error"]["code"] == "invalidRequest"
    await redis_client.hset(stack.keys.run("run-x"), mapping={"toolsetId": TS, "state": "closed"})
    reply = await call(
        nc, stack, stack.subjects.runs_credentials_set, {"runId": "run-x", "credentials": body(github="x")}
    )
    assert reply["error"]["code"] == "notFound"
    assert reply["error"]["message"] == "Run 'run-x' was closed; open a run with a new id."


# ---- parking ---------------------------------------------------------------------------------------


async def test_two_parked_calls_give_one_notice_and_resume_together_in_park_order(
    nc: Any, js: Any, redis_client: Any, stack: Stack
) -> None:
    await stack.start()
    await open_run(redis_client, stack, "run-1")
    s = stack.subjects
    await park(js, stack, "call-b")
    await park(js, stack, "call-a")
    await until(lambda: len(stack.receiver.received) == 1, "one webhook")
    # A third parked call at the same scope and server gives no new notice.
    await park(js, stack, "call-c")
    assert stack.service is not None and stack.service.logic is not None
    await until(lambda: stack.service.logic.parking.is_parked("call-c"), "third call parked")  # type: ignore[union-attr]
    events = stack.on(s.credentials_expired)
    assert events == [
        {
            "type": "credentials.expired",
            "data": {
                "toolsetId": TS,
                "namespace": "user-1",
                "runId": "run-1",
                "server": "github",
                "level": "run",
                "callIds": ["call-b", "call-a"],
            },
        }
    ]
    headers, raw = stack.receiver.received[0]
    assert Webhook(SECRET).verify(raw, headers) == events[0]
    assert len(stack.receiver.received) == 1

    # A set elsewhere resumes nothing.
    await call(nc, stack, s.toolsets_credentials_set, {"toolsetId": TS, "credentials": body(github="t2")})
    await open_run(redis_client, stack, "run-2")
    await call(nc, stack, s.runs_credentials_set, {"runId": "run-2", "credentials": body(github="r2")})
    assert stack.on(s.internal_calls_resume) == []

    await call(nc, stack, s.runs_credentials_set, {"runId": "run-1", "credentials": body(github="new")})
    await until(lambda: len(stack.on(s.internal_calls_resume)) == 1, "one CallsResume")
    assert stack.on(s.internal_calls_resume) == [{"callIds": ["call-b", "call-a", "call-c"]}]
    # Nothing is parked any more: the next set resumes nothing, and a new 401 notifies again.
    await call(nc, stack, s.runs_credentials_set, {"runId": "run-1", "credentials": body(github="newer")})
    await park(js, stack, "call-d")
    await until(lambda: len(stack.on(s.credentials_expired)) == 2, "a new notice after the resume")
    assert stack.on(s.credentials_expired)[1]["data"]["callIds"] == ["call-d"]
    assert len(stack.on(s.internal_calls_resume)) == 1


async def test_toolset_and_namespace_scopes_notify_with_their_own_fields(
    nc: Any, js: Any, redis_client: Any, stack: Stack
) -> None:
    await stack.start()
    s = stack.subjects
    await park(js, stack, "t1", level="toolset")
    await park(js, stack, "n1", level="namespace")
    await park(js, stack, "n2", level="namespace", server="stripe")
    await until(lambda: len(stack.on(s.credentials_expired)) == 3, "three notices (two scopes, two servers)")
    data = sorted((e["data"] for e in stack.on(s.credentials_expired)), key=lambda d: d["callIds"][0])
    assert data == [
        {
            "toolsetId": TS,
            "namespace": "user-1",
            "runId": None,
            "server": "github",
            "level": "namespace",
            "callIds": ["n1"],
        },
        {
            "toolsetId": TS,
            "namespace": "user-1",
            "runId": None,
            "server": "stripe",
            "level": "namespace",
            "callIds": ["n2"],
        },
        {
            "toolsetId": TS,
            "namespace": None,
            "runId": None,
            "server": "github",
            "level": "toolset",
            "callIds": ["t1"],
        },
    ]
    await call(
        nc,
        stack,
        s.namespaces_credentials_set,
        {"namespace": "user-1", "toolsetId": TS, "credentials": body(github="x", stripe="y")},
    )
    await until(lambda: len(stack.on(s.internal_calls_resume)) == 1, "namespace resume")
    assert stack.on(s.internal_calls_resume) == [{"callIds": ["n1", "n2"]}]


async def test_a_call_parked_too_long_ends_credentials_rejected(js: Any, stack: Stack) -> None:
    stack.own = CredentialsSettings(
        park_timeout="200ms", park_sweep_interval="50ms", park_notify_delay="50ms"
    )
    await stack.start()
    await park(js, stack, "slow-1")
    await until(lambda: len(stack.on(stack.subjects.internal_calls_resume)) == 1, "timeout resume")
    assert stack.on(stack.subjects.internal_calls_resume) == [
        {"callIds": ["slow-1"], "reason": "credentialsRejected"}
    ]


async def test_parked_calls_survive_a_restart_and_commands_sent_while_down_apply(
    nc: Any, js: Any, redis_client: Any, stack: Stack
) -> None:
    await stack.start()
    await open_run(redis_client, stack, "run-1")
    await park(js, stack, "p1")
    await until(lambda: len(stack.on(stack.subjects.credentials_expired)) == 1, "notice")
    await stack.stop()
    await park(js, stack, "p2")  # the service is down: JetStream keeps it
    await stack.start()
    assert stack.service is not None and stack.service.logic is not None
    await until(lambda: stack.service.logic.parking.is_parked("p2"), "p2 parked after restart")  # type: ignore[union-attr]
    await call(
        nc, stack, stack.subjects.runs_credentials_set, {"runId": "run-1", "credentials": body(github="z")}
    )
    await until(lambda: len(stack.on(stack.subjects.internal_calls_resume)) == 1, "resume after restart")
    assert stack.on(stack.subjects.internal_calls_resume) == [{"callIds": ["p1", "p2"]}]
    assert len(stack.on(stack.subjects.credentials_expired)) == 1


async def test_a_park_recorded_after_a_newer_set_at_its_scope_is_resumed_at_once(
    nc: Any, js: Any, redis_client: Any, stack: Stack
) -> None:
    """The race of the SDK walkthrough: the set reaches the service before the park command. The
    park carries the credentials version its failing attempt used; a set at the same level and
    scope since then resumes it at once instead of holding it."""
    await stack.start()
    await open_run(redis_client, stack, "run-1")
    s = stack.subjects
    raw = await redis_client.get(stack.keys.credentials_version)
    used = int(raw) if raw is not None else 0  # what the dispatcher resolved the failing headers at
    await call(nc, stack, s.runs_credentials_set, {"runId": "run-1", "credentials": body(github="fresh")})
    assert stack.on(s.internal_calls_resume) == []  # nothing was parked yet: the set resumed nothing
    await park(js, stack, "late", credentials_version=used)
    await until(lambda: len(stack.on(s.internal_calls_resume)) == 1, "the late park resumed")
    assert stack.on(s.internal_calls_resume) == [{"callIds": ["late"]}]
    assert stack.service is not None and stack.service.logic is not None
    assert not await stack.service.logic.parking.is_parked("late")

    # A set at another scope, or a park whose attempt already used the newest set, holds the call.
    await call(nc, stack, s.toolsets_credentials_set, {"toolsetId": TS, "credentials": body(github="ts")})
    raw = await redis_client.get(stack.keys.credentials_version)
    await park(js, stack, "current", credentials_version=int(raw))
    await until(lambda: stack.service.logic.parking.is_parked("current"), "current parked")  # type: ignore[union-attr]
    await until(lambda: len(stack.on(s.credentials_expired)) == 1, "its notice")
    assert stack.on(s.credentials_expired)[0]["data"]["callIds"] == ["current"]
    assert len(stack.on(s.internal_calls_resume)) == 1
    await call(nc, stack, s.runs_credentials_set, {"runId": "run-1", "credentials": body(github="next")})
    await until(lambda: len(stack.on(s.internal_calls_resume)) == 2, "the next set resumes it")
    assert stack.on(s.internal_calls_resume)[1] == {"callIds": ["current"]}


async def test_run_closed_drops_parked_calls_and_run_credentials(
    nc: Any, js: Any, redis_client: Any, stack: Stack
) -> None:
    await stack.start()
    await open_run(redis_client, stack, "run-9")
    await call(
        nc, stack, stack.subjects.runs_credentials_set, {"runId": "run-9", "credentials": body(github="r")}
    )
    await park(js, stack, "c9", run_id="run-9")
    await park(js, stack, "c9t", run_id="run-9", level="toolset")
    assert stack.service is not None and stack.service.logic is not None
    logic = stack.service.logic
    await until(lambda: logic.parking.is_parked("c9t"), "parked")
    await redis_client.hset(stack.keys.run("run-9"), "state", "closed")
    await publish_command(
        js,
        stack.subjects.internal_runs_closed,
        RunClosed(run_id="run-9", toolset_id=TS, call_ids=["c9", "c9t"]).wire_json(),
    )

    async def gone() -> bool:
        return not await logic.parking.is_parked("c9") and not await logic.parking.is_parked("c9t")

    await until(gone, "run's parked calls dropped")
    await until(lambda: _level(logic, "run-9"), "run credentials dropped")
    await call(
        nc, stack, stack.subjects.toolsets_credentials_set, {"toolsetId": TS, "credentials": body(github="t")}
    )
    assert stack.on(stack.subjects.internal_calls_resume) == []


async def _level(logic: Any, run_id: str) -> bool:
    got = await logic.store.resolve(toolset_id=TS, namespace=None, run_id=run_id, server="github")
    return bool(got.level is None)


# ---- secrets --------------------------------------------------------------------------------------


async def test_no_secret_in_replies_events_webhooks_logs_or_redis(
    nc: Any, js: Any, redis_client: Any, stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await stack.start()
    await open_run(redis_client, stack, "run-1")
    s = stack.subjects
    auth = {"servers": {"github": {"headers": {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": TOKEN}}}}
    await call(nc, stack, s.toolsets_credentials_set, {"toolsetId": TS, "credentials": auth})
    await call(
        nc, stack, s.namespaces_credentials_set, {"namespace": "user-1", "toolsetId": TS, "credentials": auth}
    )
    await call(nc, stack, s.runs_credentials_set, {"runId": "run-1", "credentials": auth})
    # A refused request that carries the token.
    bad = {"servers": {"gitlab": {"headers": {"Authorization": f"Bearer {TOKEN}"}}}}
    await call(nc, stack, s.toolsets_credentials_set, {"toolsetId": TS, "credentials": bad})
    await call(
        nc,
        stack,
        s.toolsets_credentials_set,
        {
            "toolsetId": TS,
            "credentials": {"servers": {"github": {"headers": {"Authorization": f" {TOKEN}"}}}},
        },
    )
    await park(js, stack, "sec-1")
    await until(lambda: len(stack.receiver.received) == 1, "webhook")
    await call(nc, stack, s.runs_credentials_set, {"runId": "run-1", "credentials": auth})
    await until(lambda: len(stack.on(s.internal_calls_resume)) == 1, "resume")

    assert all(TOKEN not in json.dumps(r) for r in stack.replies)
    published = [b for subject, msgs in stack.seen.items() if ".credentials.set" not in subject for b in msgs]
    assert published and all(TOKEN.encode() not in b for b in published)
    assert all(TOKEN.encode() not in raw and TOKEN not in json.dumps(h) for h, raw in stack.receiver.received)
    formatter = JsonFormatter()
    lines = [formatter.format(r) for r in caplog.records] + [r.getMessage() for r in caplog.records]
    assert lines and all(TOKEN not in line for line in lines)
    assert all(SECRET not in line for line in lines)
    keys = [k async for k in redis_client.scan_iter(match=f"{stack.keys.prefix}:*")]
    assert keys
    dumps = [await redis_client.dump(key) for key in keys]
    # A key may go between SCAN and DUMP (the parked call's entries are removed as it is resumed).
    assert any(d is not None for d in dumps)
    assert all(TOKEN.encode() not in d for d in dumps if d is not None)
