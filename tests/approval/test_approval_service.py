"""The approval service against real NATS (JetStream) and Redis.

The tests play the dispatcher: they publish `ApprovalNeeded` on the internal subject and read
`ApprovalDecided` from the INTERNAL stream (which is also how a decision made while no dispatcher
consumes reaches it later: it waits in the stream). Most run the service in this process; the
restart tests run it as `python -m toolbus_approval` and kill it.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from standardwebhooks import Webhook
from toolbus_approval.app import ApprovalApp
from toolbus_approval.settings import ApprovalSettings
from toolbus_approval.store import ApprovalStore
from toolbus_common.canonical import sha256_hex
from toolbus_common.clock import now_iso
from toolbus_common.keys import Keys
from toolbus_common.settings import Settings
from toolbus_contracts import Subjects
from toolbus_contracts.internal import ApprovalNeeded, RunClosed

from tests.support.commands import TEST_SECRET_KEY, publish_command
from tests.support.infra import aservice_process, js_name, request
from tests.support.infra import until as wait_for

pytestmark = pytest.mark.integration


# ---- helpers -----------------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return f"{kind}_{uuid.uuid4().hex[:12]}"


def needed(**overrides: Any) -> ApprovalNeeded:
    body: dict[str, Any] = {
        "approval_id": new_id("ap"),
        "call_id": new_id("call"),
        "run_id": new_id("run"),
        "namespace": "user-42",
        "toolset_id": "ts_" + "a" * 64,
        "tool": "stripe.create_refund",
        "input": {"charge": "ch_1", "amount": 500},
        "requested_at": now_iso(),
    }
    body.update(overrides)
    body.setdefault("input_digest", sha256_hex(body["input"]))
    return ApprovalNeeded(**body)


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait for `check()` to hold (for a background consumer or loop to catch up)."""
    await wait_for(check, what, limit=20.0)


class Stack:
    """What a test needs to play the dispatcher against one approval service."""

    def __init__(self, nc: Any, js: Any, redis: Any, prefix: str) -> None:
        self.nc = nc
        self.js = js
        self.redis = redis
        self.prefix = prefix
        self.subjects = Subjects(prefix)
        self.stream = js_name(prefix, "INTERNAL")
        self.keys = Keys(prefix)

    async def send(self, command: ApprovalNeeded | RunClosed) -> None:
        subject = (
            self.subjects.internal_approval_requests
            if isinstance(command, ApprovalNeeded)
            else self.subjects.internal_runs_closed
        )
        await publish_command(self.js, subject, command.wire_json(), stream=self.stream, timeout=5)

    async def decide(self, approval_id: str, approve: bool, reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"approvalId": approval_id, "approve": approve}
        if reason is not None:
            body["reason"] = reason
        return await request(self.nc, self.subjects.approvals_decide, body)

    async def pending(self, **filters: str) -> list[dict[str, Any]]:
        reply = await request(self.nc, self.subjects.approvals_list, filters)
        assert reply["ok"] is True, reply
        approvals: list[dict[str, Any]] = reply["data"]["approvals"]
        return approvals

    async def decisions(self, approval_id: str) -> list[dict[str, Any]]:
        """Every ApprovalDecided for `approval_id` now in the INTERNAL stream, oldest first."""
        subject = self.subjects.internal_approval_decisions
        info = await self.js.stream_info(self.stream)
        if info.state.messages == 0:
            return []
        sub = await self.js.subscribe(subject, stream=self.stream, ordered_consumer=True)
        found: list[dict[str, Any]] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=2)
                except TimeoutError:
                    return found  # nothing at all on the subject yet
                body = json.loads(msg.data)
                if body["approvalId"] == approval_id:
                    found.append(body)
                if msg.metadata.num_pending == 0:
                    return found
        finally:
            await sub.unsubscribe()

    async def decision(self, approval_id: str) -> dict[str, Any]:
        """The first ApprovalDecided for `approval_id`, waiting for it to be published."""
        sub = await self.js.subscribe(
            self.subjects.internal_approval_decisions, stream=self.stream, ordered_consumer=True
        )
        try:
            while True:
                msg = await sub.next_msg(timeout=20)
                body: dict[str, Any] = json.loads(msg.data)
                if body["approvalId"] == approval_id:
                    return body
        finally:
            await sub.unsubscribe()


class Events:
    """`approval.requested` events as published (core NATS), collected from subscribe time."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def cb(self, msg: Any) -> None:
        await self.queue.put(json.loads(msg.data))

    async def next_for(self, approval_ids: set[str]) -> dict[str, Any]:
        while True:
            event = await asyncio.wait_for(self.queue.get(), 20)
            if event["approvalId"] in approval_ids:
                return event


@pytest.fixture
def settings(nats_url: str, redis_url: str, prefix: str, redis_prefix: str) -> Settings:
    return Settings(
        nats_url=nats_url,
        redis_url=redis_url,
        subject_prefix=prefix,
        redis_prefix=redis_prefix,
        secret_key=TEST_SECRET_KEY,
    )


@pytest_asyncio.fixture(loop_scope="session")
async def stack(nc: Any, js: Any, redis_client: Any, prefix: str) -> Stack:
    return Stack(nc, js, redis_client, prefix)


@pytest_asyncio.fixture(loop_scope="session")
async def service(settings: Settings) -> AsyncIterator[ApprovalApp]:
    app = ApprovalApp(settings, ApprovalSettings(approval_sweep_interval=0.05))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def events(nc: Any, prefix: str) -> AsyncIterator[Events]:
    collected = Events()
    sub = await nc.subscribe(Subjects(prefix).approvals_requested, cb=collected.cb)
    await nc.flush()
    try:
        yield collected
    finally:
        await sub.unsubscribe()


async def requested(stack: Stack, events: Events, command: ApprovalNeeded) -> dict[str, Any]:
    await stack.send(command)
    return await events.next_for({command.approval_id})


# ---- the flow ----------------------------------------------------------------------------------


async def test_approve_announces_lists_and_sends_the_bound_decision(
    service: ApprovalApp, stack: Stack, events: Events
) -> None:
    command = needed()
    event = await requested(stack, events, command)
    assert event == {
        "approvalId": command.approval_id,
        "callId": command.call_id,
        "runId": command.run_id,
        "namespace": "user-42",
        "toolsetId": command.toolset_id,
        "tool": "stripe.create_refund",
        "input": {"charge": "ch_1", "amount": 500},
        "requestedAt": command.requested_at,
    }
    assert await stack.pending(runId=command.run_id) == [event]

    reply = await stack.decide(command.approval_id, True)
    assert reply == {"ok": True, "data": {"approvalId": command.approval_id, "decision": "approved"}}
    assert await stack.decision(command.approval_id) == {
        "approvalId": command.approval_id,
        "callId": command.call_id,
        "runId": command.run_id,
        "toolsetId": command.toolset_id,
        "tool": "stripe.create_refund",
        "inputDigest": command.input_digest,
        "decision": "approved",
        "decider": "anonymous",  # no `decider` given, and this service trusts no header
    }
    assert await stack.pending(runId=command.run_id) == []


async def test_deny_carries_the_reason(service: ApprovalApp, stack: Stack, events: Events) -> None:
    command = needed()
    await requested(stack, events, command)
    reply = await stack.decide(command.approval_id, False, "refund too large")
    assert reply == {"ok": True, "data": {"approvalId": command.approval_id, "decision": "denied"}}
    decided = await stack.decision(command.approval_id)
    assert (decided["decision"], decided["reason"]) == ("denied", "refund too large")


async def test_list_filters_by_run_and_namespace_in_request_order(
    service: ApprovalApp, stack: Stack, events: Events
) -> None:
    run_id, namespace = new_id("run"), new_id("ns")
    first = needed(run_id=run_id, namespace=namespace, requested_at="2026-01-01T00:00:01.000Z")
    second = needed(run_id=run_id, namespace=namespace, requested_at="2026-01-01T00:00:00.000Z")
    other_run = needed(namespace=namespace, requested_at="2026-01-01T00:00:02.000Z")
    for command in (first, second, other_run):
        await requested(stack, events, command)

    by_run = [a["approvalId"] for a in await stack.pending(runId=run_id)]
    assert by_run == [second.approval_id, first.approval_id]
    by_ns = [a["approvalId"] for a in await stack.pending(namespace=namespace)]
    assert by_ns == [second.approval_id, first.approval_id, other_run.approval_id]
    assert await stack.pending(runId=run_id, namespace="someone-else") == []
    everything = [a["approvalId"] for a in await stack.pending()]
    assert {second.approval_id, first.approval_id, other_run.approval_id} <= set(everything)
    for command in (first, second, other_run):
        assert (await stack.decide(command.approval_id, False))["ok"] is True


async def page_through(stack: Stack, **body: Any) -> list[list[str]]:
    """The approval ids of every page of `approvals.list`, following `nextCursor`."""
    pages: list[list[str]] = []
    while True:
        reply = await request(stack.nc, stack.subjects.approvals_list, body)
        assert reply["ok"] is True, reply
        pages.append([a["approvalId"] for a in reply["data"]["approvals"]])
        if "nextCursor" not in reply["data"]:
            return pages
        body = {**body, "cursor": reply["data"]["nextCursor"]}


async def test_list_pages_by_limit_and_a_cursor_holds_across_decisions(
    service: ApprovalApp, stack: Stack, events: Events
) -> None:
    run_id = new_id("run")
    # three share one millisecond: the index orders them by id
    stamps = [f"2026-01-01T00:00:0{i}.000Z" for i in range(6)] + ["2026-01-01T00:00:03.000Z"] * 2
    commands = [needed(run_id=run_id, requested_at=at) for at in stamps]
    for command in commands:
        await requested(stack, events, command)
    order = [c.approval_id for c in sorted(commands, key=lambda c: (c.requested_at, c.approval_id))]

    pages = await page_through(stack, runId=run_id, limit=3)
    assert [len(p) for p in pages] == [3, 3, 2]  # no empty last page
    assert [a for p in pages for a in p] == order
    split = await page_through(stack, runId=run_id, limit=4)  # a page ends inside the millisecond
    assert split == [order[:4], order[4:]]
    assert await page_through(stack, runId=run_id) == [order]  # one page holds them all

    # decided between two pages: the cursor still starts right after the last one seen
    first = await request(stack.nc, stack.subjects.approvals_list, {"runId": run_id, "limit": 3})
    for gone in (order[2], order[3]):  # the last one seen, and the first one of the next page
        assert (await stack.decide(gone, False))["ok"] is True
    rest = await page_through(stack, runId=run_id, limit=3, cursor=first["data"]["nextCursor"])
    assert [a for p in rest for a in p] == order[4:]
    for approval_id in order[:2] + order[4:]:
        assert (await stack.decide(approval_id, True))["ok"] is True
    assert await page_through(stack, runId=run_id) == [[]]


async def test_pending_inputs_larger_than_one_message_together_come_a_page_at_a_time(
    service: ApprovalApp, stack: Stack, events: Events
) -> None:
    """Unpaged, three pending inputs of 400 kB in one run were `outputTooLarge` whatever the
    filter; each page now holds what fits in one message."""
    run_id = new_id("run")
    big = [needed(run_id=run_id, input={"blob": f"{i}" * 400_000}) for i in range(3)]
    for command in big:
        await requested(stack, events, command)
    sizes: list[int] = []
    body: dict[str, Any] = {"runId": run_id}
    seen: list[str] = []
    while True:
        msg = await stack.nc.request(stack.subjects.approvals_list, json.dumps(body).encode(), timeout=10)
        sizes.append(len(msg.data))
        data = json.loads(msg.data)["data"]
        seen += [a["approvalId"] for a in data["approvals"]]
        if "nextCursor" not in data:
            break
        body["cursor"] = data["nextCursor"]
    assert sorted(seen) == sorted(c.approval_id for c in big)
    assert len(sizes) == 2 and max(sizes) <= stack.nc.max_payload
    for command in big:
        assert (await stack.decide(command.approval_id, False))["ok"] is True


async def test_redelivered_command_creates_one_approval_and_one_event(
    service: ApprovalApp, stack: Stack, events: Events
) -> None:
    command = needed(requested_at="2026-01-01T00:00:00.000Z")
    marker = needed(run_id=command.run_id, requested_at="2026-01-01T00:00:01.000Z")
    await stack.send(command)
    await stack.send(command)
    await stack.send(marker)
    # The consumer handles commands in stream order: once the marker is announced, both copies of
    # the first command have been handled.
    seen = [(await events.next_for({command.approval_id, marker.approval_id}))["approvalId"] for _ in "ab"]
    assert seen == [command.approval_id, marker.approval_id]
    assert [a["approvalId"] for a in await stack.pending(runId=command.run_id)] == [
        command.approval_id,
        marker.approval_id,
    ]


async def test_a_redelivery_announces_an_approval_stored_for_a_remembered_decision_now_gone(
    settings: Settings, service: ApprovalApp, stack: Stack, events: Events
) -> None:
    command = needed(requested_at="2026-01-01T00:00:00.000Z")
    marker = needed(run_id=command.run_id, requested_at="2026-01-01T00:00:01.000Z")
    # A remembered decision matched, so the approval was stored unannounced; the service died
    # before deciding it, and the remembered decision expired before the command came again.
    store = ApprovalStore(stack.redis, stack.keys, settings.subjects)
    created = await store.create(command, expires_ms=None, now_ms=0, announce=False)
    assert created.created and not created.announced
    event = await requested(stack, events, command)
    assert event["approvalId"] == command.approval_id
    assert command.approval_id in [a["approvalId"] for a in await stack.pending(runId=command.run_id)]
    # Announced once: a further copy announces nothing (the marker's event comes next).
    await stack.send(command)
    await stack.send(marker)
    assert (await events.next_for({command.approval_id, marker.approval_id}))["approvalId"] == (
        marker.approval_id
    )


async def test_second_decision_is_conflict_and_the_first_stands(
    service: ApprovalApp, stack: Stack, events: Events
) -> None:
    command = needed()
    await requested(stack, events, command)
    assert (await stack.decide(command.approval_id, True))["ok"] is True
    second = await stack.decide(command.approval_id, False, "changed my mind")
    assert second["ok"] is False
    assert second["error"]["code"] == "conflict"
    assert "already approved" in second["error"]["message"]
    assert second["error"]["details"] == {"state": "approved"}
    await stack.decision(command.approval_id)
    assert [d["decision"] for d in await stack.decisions(command.approval_id)] == ["approved"]


async def test_concurrent_decisions_exactly_one_wins(
    service: ApprovalApp, stack: Stack, events: Events
) -> None:
    command = needed()
    await requested(stack, events, command)
    replies = await asyncio.gather(*(stack.decide(command.approval_id, i % 2 == 0) for i in range(12)))
    winners = [r for r in replies if r["ok"]]
    assert len(winners) == 1
    assert all(r["error"]["code"] == "conflict" for r in replies if not r["ok"])
    winner = winners[0]["data"]["decision"]
    await stack.decision(command.approval_id)
    assert [d["decision"] for d in await stack.decisions(command.approval_id)] == [winner]


async def test_unknown_approval_is_not_found(service: ApprovalApp, stack: Stack) -> None:
    reply = await stack.decide("ap_does_not_exist", True)
    assert reply["ok"] is False
    assert reply["error"]["code"] == "notFound"
    assert "ap_does_not_exist" in reply["error"]["message"]


@pytest.mark.parametrize(
    ("subject", "body", "field"),
    [
        ("decide", b"{not json", "body"),
        ("decide", b"", "body"),
        ("decide", {"approve": True}, "approvalId"),
        ("decide", {"approvalId": "ap_1"}, "approve"),
        ("decide", {"approvalId": "ap_1", "approve": "maybe"}, "approve"),
        ("decide", {"approvalId": "ap_1", "approve": [True]}, "approve"),
        ("decide", {"approvalId": 7, "approve": True}, "approvalId"),
        ("decide", {"approvalId": "", "approve": True}, "approvalId"),
        ("decide", {"approvalId": "a" * 900_000, "approve": True}, "approvalId"),
        ("decide", {"approvalId": "ap 1\n", "approve": True}, "approvalId"),
        ("decide", {"approvalId": "ap_1", "approve": True, "reason": 3}, "reason"),
        ("decide", {"approvalId": "ap_1", "approve": True, "approval_id": "x"}, "approval_id"),
        ("list", {"runId": 5}, "runId"),
        ("list", {"namespace": ["a"]}, "namespace"),
        ("list", {"run": "r"}, "run"),
        ("list", b"[]", "body"),
        ("list", {"limit": 0}, "limit"),
        ("list", {"limit": 1001}, "limit"),
        ("list", {"limit": "5"}, "limit"),
        ("list", {"cursor": 5}, "cursor"),
        ("list", {"cursor": "!!not-one"}, "cursor"),
        ("list", {"cursor": "eDp5"}, "cursor"),  # base64 of "x:y": not a place in the index
        ("list", {"cursor": "MTIz"}, "cursor"),  # "123": no approval id
        ("list", {"cursor": "MDE6YXBfMQ"}, "cursor"),  # "01:ap_1": not as approvals.list writes it
        ("list", {"cursor": "MTphcF8x=="}, "cursor"),  # "1:ap_1" with padding it never has
    ],
)
async def test_malformed_bodies_are_invalid_request_naming_the_field(
    service: ApprovalApp, stack: Stack, subject: str, body: Any, field: str
) -> None:
    target = stack.subjects.approvals_decide if subject == "decide" else stack.subjects.approvals_list
    reply = await request(stack.nc, target, body)
    assert reply["ok"] is False
    assert reply["error"]["code"] == "invalidRequest"
    assert reply["error"]["details"]["field"] == field


async def test_malformed_command_is_dropped_and_the_next_one_handled(
    service: ApprovalApp, stack: Stack, events: Events
) -> None:
    await publish_command(
        stack.js,
        stack.subjects.internal_approval_requests,
        b'{"approvalId": 1}',
        stream=stack.stream,
        timeout=5,
    )
    command = needed()
    assert (await requested(stack, events, command))["approvalId"] == command.approval_id


# ---- run closed, expiry ----------------------------------------------------------------------------


async def test_run_closed_cancels_pending_approvals(
    service: ApprovalApp, stack: Stack, events: Events
) -> None:
    command = needed()
    other = needed()
    await requested(stack, events, command)
    await requested(stack, events, other)
    await stack.send(RunClosed(run_id=command.run_id, toolset_id=command.toolset_id, call_ids=[]))
    # A command of the same run arriving after the close (redelivered late) starts cancelled.
    late = needed(run_id=command.run_id)
    await stack.send(late)
    marker = needed()
    await requested(stack, events, marker)  # the needed-consumer has handled `late` by now

    async def run_has_no_pending() -> bool:
        return not await stack.pending(runId=command.run_id)

    # The runs-closed consumer is a second, independent consumer: wait for it to catch up.
    await until(run_has_no_pending, "the closed run's approvals leave the pending list")

    reply = await stack.decide(command.approval_id, True)
    assert reply["ok"] is False
    assert reply["error"]["code"] == "conflict"
    assert "run closed" in reply["error"]["message"]
    assert (await stack.decide(late.approval_id, True))["error"]["code"] == "conflict"
    assert [a["approvalId"] for a in await stack.pending(runId=other.run_id)] == [other.approval_id]
    assert await stack.decisions(command.approval_id) == []


async def test_expired_approval_is_denied_with_reason_expired(
    settings: Settings, stack: Stack, events: Events
) -> None:
    app = ApprovalApp(settings, ApprovalSettings(approval_timeout="200ms", approval_sweep_interval=0.05))
    await app.start()
    try:
        command = needed()
        await requested(stack, events, command)
        decided = await stack.decision(command.approval_id)
        assert (decided["decision"], decided["reason"]) == ("denied", "expired")
        reply = await stack.decide(command.approval_id, True)
        assert reply["error"]["code"] == "conflict"
        assert "expired" in reply["error"]["message"]
        assert await stack.pending(runId=command.run_id) == []
    finally:
        await app.stop()


# ---- crash safety and restarts ---------------------------------------------------------------------


async def test_decision_recorded_but_unpublished_is_sent_on_start(
    settings: Settings, stack: Stack, events: Events
) -> None:
    app = ApprovalApp(settings, ApprovalSettings())
    await app.start()
    command = needed()
    try:
        await requested(stack, events, command)
    finally:
        await app.stop()
    # The service died between recording the decision and publishing it: only Redis knows.
    store = ApprovalStore(stack.redis, stack.keys, settings.subjects)
    result = await store.transition(command.approval_id, "denied", "no", decided_at=now_iso(), now_ms=0)
    assert result.outcome == "ok"
    assert await stack.decisions(command.approval_id) == []

    app = ApprovalApp(settings, ApprovalSettings())
    await app.start()
    try:
        decided = await stack.decision(command.approval_id)
        assert (decided["decision"], decided["reason"]) == ("denied", "no")
    finally:
        await app.stop()


async def test_what_an_earlier_version_queued_unsent_is_sent_on_start(
    settings: Settings, stack: Stack, events: Events
) -> None:
    # As a version before the outbox left them: an approval stored with its announcement queued in
    # the `announce` sorted set, and a decision recorded with it queued in the `outbox` one.
    store = ApprovalStore(stack.redis, stack.keys, settings.subjects)
    announce, decisions = stack.keys.approvals_legacy_queues
    unannounced, decided = needed(), needed()
    for command in (unannounced, decided):
        assert (await store.create(command, expires_ms=None, now_ms=0, announce=False)).created
    await store.transition(decided.approval_id, "approved", "ok", decided_at=now_iso(), now_ms=0)
    await stack.redis.delete(stack.keys.approvals_outbox)  # that version wrote no outbox entry
    await stack.redis.zadd(announce, {unannounced.approval_id: 0})
    await stack.redis.zadd(decisions, {decided.approval_id: 0})

    app = ApprovalApp(settings, ApprovalSettings())
    await app.start()
    try:
        await events.next_for({unannounced.approval_id})
        assert (await stack.decision(decided.approval_id))["decision"] == "approved"
        assert await stack.redis.exists(announce, decisions) == 0
    finally:
        await app.stop()


@pytest.fixture
def service_env_for(service_env: dict[str, str]) -> dict[str, str]:
    return {**service_env, "TOOLBUS_APPROVAL_SWEEP_INTERVAL": "0.1"}


async def test_restart_of_the_approval_service_keeps_pending_approvals(
    service_env_for: dict[str, str], stack: Stack, events: Events
) -> None:
    command = needed()
    async with aservice_process("approval", service_env_for) as first:
        await requested(stack, events, command)
        first.kill()  # a crash: no shutdown code runs

    # Sent while no approval service runs: the INTERNAL stream keeps it.
    while_down = needed(run_id=command.run_id)
    await stack.send(while_down)

    async with aservice_process("approval", service_env_for):
        await events.next_for({while_down.approval_id})
        listed = [a["approvalId"] for a in await stack.pending(runId=command.run_id)]
        assert listed == [command.approval_id, while_down.approval_id]
        reply = await stack.decide(command.approval_id, True)
        assert reply == {"ok": True, "data": {"approvalId": command.approval_id, "decision": "approved"}}
        assert (await stack.decision(command.approval_id))["decision"] == "approved"
        assert (await stack.decide(while_down.approval_id, False))["ok"] is True


# ---- webhook ---------------------------------------------------------------------------------------


class _Receiver(http.server.BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook_receiver() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    received: list[tuple[dict[str, str], bytes]] = []
    handler = type("Receiver", (_Receiver,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_approval_requested_webhook_is_signed_and_sent_once(
    settings: Settings,
    stack: Stack,
    events: Events,
    webhook_receiver: tuple[str, list[tuple[dict[str, str], bytes]]],
) -> None:
    url, received = webhook_receiver
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    hooked = Settings(**{**settings.model_dump(), "webhook_url": url, "webhook_secret": secret})
    app = ApprovalApp(hooked, ApprovalSettings(approval_sweep_interval=0.05, webhook_timeout="7s"))
    await app.start()
    try:
        assert app._webhooks is not None and app._webhooks.timeout == 7.0  # TOOLBUS_WEBHOOK_TIMEOUT
        command = needed()
        event = await requested(stack, events, command)
        await stack.send(command)  # redelivered: no second webhook
        marker = needed()
        await requested(stack, events, marker)

        async def both_delivered() -> bool:
            bodies = [body for _, body in received]
            return all(
                any(i.encode() in b for b in bodies) for i in (command.approval_id, marker.approval_id)
            )

        await until(both_delivered, "both webhooks delivered")
    finally:
        await app.stop()
    mine = [(h, b) for h, b in received if command.approval_id.encode() in b]
    assert len(mine) == 1
    headers, body = mine[0]
    payload = Webhook(secret).verify(body, headers)
    assert payload == {"type": "approval.requested", "data": event}
    assert headers["webhook-id"] == f"msg_approval_requested_{command.approval_id}"
    assert secret not in body.decode()
