"""Every service's handlers on FastStream's in-memory `TestNatsBroker` (fast, no server): each
subject parses its body with the contract model (bad input is `invalidRequest` naming the field),
calls its logic and replies with the envelope; commands are parsed, applied and acked, and a body
that does not parse is dead-lettered. The logic objects here are small recorders: the logic
itself is tested on real NATS and Redis in each service's folder (`-m integration`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import nats.errors
import pytest
from faststream.nats import JStream, TestNatsBroker
from faststream.response.publish_type import PublishType
from toolbus_approval.handlers import routes as approval_routes
from toolbus_approval.identity import Identity
from toolbus_common.bus import Bus, RawJson, ReplyGuard, Routes, misdirected_reply
from toolbus_common.settings import Settings
from toolbus_contracts import (
    CallGetReply,
    RunCloseReply,
    RunOpenReply,
    ToolsetDeclarationsReply,
    ToolsetSearchReply,
)
from toolbus_contracts.approvals import ApprovalDecideReply
from toolbus_contracts.credentials import CredentialsSetReply
from toolbus_contracts.errors import Conflict, NotFound
from toolbus_credentials.handlers import routes as credentials_routes
from toolbus_dispatcher.handlers import routes as dispatcher_routes
from toolbus_registry.handlers import routes as registry_routes

from tests.support.commands import TEST_SECRET_KEY, signed

SETTINGS = Settings(subject_prefix="tbunit", secret_key=TEST_SECRET_KEY)
S = SETTINGS.subjects
TS = "ts_" + "0" * 64


class Recorder:
    """Records what a handler called, answers what the test says."""

    def __init__(self, **answers: Any) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.answers = answers

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("calls", "answers"):
            raise AttributeError(name)

        async def record(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args[0] if args and not kwargs else (args, kwargs)))
            answer = self.answers.get(name)
            if isinstance(answer, Exception):
                raise answer
            return answer

        return record


async def command(broker: Any, bus: Bus, subject: str, body: bytes) -> None:
    """A command into the INTERNAL stream, signed as a service signs it."""
    await broker.publish(body, subject, stream=bus.stream, headers=signed(subject, body))


@asynccontextmanager
async def serving(routes: Routes[Any], logic: Recorder) -> AsyncIterator[tuple[Any, Bus, list[bytes]]]:
    bus = Bus(SETTINGS, name="unit", queue="unit")
    bus.include(routes, logic, serve_fast_raw=False)
    dead: list[bytes] = []

    async def as_is(msg: Any) -> Any:
        return msg

    @bus.broker.subscriber(
        S._s("internal.deadletter.>"), stream=JStream(bus.stream, declare=False), decoder=as_is
    )
    async def keep(msg: Any) -> None:
        dead.append(msg.body)

    async with TestNatsBroker(bus.broker) as broker:
        yield broker, bus, dead


async def ask(broker: Any, subject: str, body: bytes | dict[str, Any]) -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = await broker.request(data, subject, timeout=3)
    result: dict[str, Any] = json.loads(reply.body)
    return result


# ---- registry ----------------------------------------------------------------------------------


async def test_registry_subjects_parse_call_and_reply() -> None:
    logic = Recorder(
        create=RawJson(b'{"id":"ts_1","toolCount":2,"truncated":true}'),
        declarations=ToolsetDeclarationsReply(format="prompt", text="a\n"),
        search=ToolsetSearchReply(tools=[]),
    )
    async with serving(registry_routes, logic) as (broker, _, _):
        created = await ask(broker, S.toolsets_create, {"mcp": []})
        assert created == {"ok": True, "data": {"id": "ts_1", "toolCount": 2, "truncated": True}}
        declared = await ask(broker, S.toolsets_declarations, {"id": TS, "format": "prompt"})
        assert declared == {"ok": True, "data": {"format": "prompt", "text": "a\n"}}
        bad = await ask(broker, S.toolsets_search, {"id": TS, "query": "x", "limit": 99})
        assert bad["error"]["code"] == "invalidRequest" and bad["error"]["details"] == {"field": "limit"}
        assert [name for name, _ in logic.calls] == ["create", "declarations"]


# ---- dispatcher --------------------------------------------------------------------------------


async def test_dispatcher_subjects_parse_call_and_reply() -> None:
    logic = Recorder(
        open_run=RunOpenReply(run_id="run_1"),
        close_run=RunCloseReply(run_id="run_1", cancelled=2),
        get_call=CallGetReply(call_id="call_1", state="running", attempts=1),
        start_call=SimpleNamespace(call_id="call_2", idempotency_key="k"),
    )
    async with serving(dispatcher_routes, logic) as (broker, _, _):
        assert await ask(broker, S.runs_open, {"toolsetId": TS}) == {
            "ok": True,
            "data": {"runId": "run_1"},
        }
        closed = await ask(broker, S.runs_close, {"runId": "run_1"})
        assert closed == {"ok": True, "data": {"runId": "run_1", "cancelled": 2}}
        got = await ask(broker, S.calls_get, {"callId": "call_1"})
        assert got == {"ok": True, "data": {"callId": "call_1", "state": "running", "attempts": 1}}
        started = await ask(broker, S.calls_start, {"runId": "run_1", "tool": "a.b", "input": {}})
        assert started == {"ok": True, "data": {"callId": "call_2", "idempotencyKey": "k"}}
        unknown = await ask(broker, S.calls_start, {"runId": "run_1", "tool": "a.b", "run_id": "x"})
        assert unknown["error"]["code"] == "invalidRequest" and unknown["error"]["details"] == {
            "field": "run_id"
        }
        empty = await ask(broker, S.calls_get, b"")
        assert empty["error"]["details"] == {"field": "body"}


async def test_dispatcher_commands_apply_and_dead_letter_bad_bodies() -> None:
    logic = Recorder()
    async with serving(dispatcher_routes, logic) as (broker, bus, dead):
        decided = {
            "approvalId": "apr_1", "callId": "call_1", "runId": "run_1", "toolsetId": TS,
            "tool": "a.b", "inputDigest": "d", "decision": "approved",
        }  # fmt: skip
        await command(broker, bus, S.internal_approval_decisions, json.dumps(decided).encode())
        await command(broker, bus, S.internal_calls_resume, b'{"callIds": "call_1"}')
        await command(broker, bus, S.internal_calls_resume, b'{"callIds": ["call_1", "call_2"]}')
        names = [name for name, _ in logic.calls]
        assert names == ["apply_decision", "apply_resume"]
        assert logic.calls[0][1].approval_id == "apr_1" and logic.calls[0][1].decision == "approved"
        assert logic.calls[1][1].call_ids == ["call_1", "call_2"]
        assert dead == [b'{"callIds": "call_1"}']


async def test_a_command_no_service_signed_is_never_applied() -> None:
    """What a client could make land in the INTERNAL stream (a JetStream answer, a reply aimed at
    an internal subject) carries no service's signature: refused, neither applied nor
    dead-lettered; a signature made for another subject, or with another key, is refused too."""
    logic = Recorder()
    async with serving(dispatcher_routes, logic) as (broker, bus, dead):
        body = {
            "approvalId": "apr_1", "callId": "call_1", "runId": "run_1", "toolsetId": TS,
            "tool": "a.b", "inputDigest": "d", "decision": "approved",
        }  # fmt: skip
        decided = json.dumps(body).encode()
        subject = S.internal_approval_decisions
        await broker.publish(decided, subject, stream=bus.stream)
        await broker.publish(decided, subject, stream=bus.stream, headers={"Toolbus-Signature": "0" * 64})
        other = signed(S.internal_calls_resume, decided)
        await broker.publish(decided, subject, stream=bus.stream, headers=other)
        foreign = signed(subject, decided, secret="b3RoZXIta2V5LW90aGVyLWtleS1vdGhlci1rZXktISE=")
        await broker.publish(decided, subject, stream=bus.stream, headers=foreign)
        assert logic.calls == [] and dead == []
        await command(broker, bus, subject, decided)
        assert [name for name, _ in logic.calls] == ["apply_decision"]


async def test_a_request_whose_reply_subject_is_not_an_inbox_gets_no_answer_and_does_nothing() -> None:
    """A reply subject under the deployment's prefix (its events, its INTERNAL commands) or of
    JetStream asks the service to write where only services write: the request is dropped."""
    logic = Recorder(get=None)
    async with serving(dispatcher_routes, logic) as (broker, _bus, _):
        for reply in (
            S.internal_approval_decisions,
            S.run_events("run_1").replace("*", "call_1"),
            "$O.x.C.y",
        ):
            await broker.publish(b'{"callId": "call_1"}', S.calls_get, reply_to=reply)
        assert logic.calls == []
        await broker.publish(b'{"callId": "call_1"}', S.calls_get, reply_to="_INBOX.harness.x")
        assert len(logic.calls) == 1  # the same request with an inbox is handled
    assert misdirected_reply("tbunit", "tbunit.internal.approvals.decided")
    assert misdirected_reply("tbunit", "$JS.API.STREAM.INFO.X")
    assert not misdirected_reply("tbunit", "_INBOX.harness.abc")
    assert not misdirected_reply("tbunit", "_R_.abc.def")
    assert not misdirected_reply("tbunit", None)


# ---- approval ----------------------------------------------------------------------------------


async def test_approval_subjects_parse_call_and_reply() -> None:
    logic = Recorder(
        pending=([], None),  # one page, the last
        decide=ApprovalDecideReply(approval_id="apr_1", decision="denied"),
    )
    logic.list_budget = 1000  # type: ignore[attr-defined]
    logic.identity = Identity()  # type: ignore[attr-defined]
    async with serving(approval_routes, logic) as (broker, bus, dead):
        listed = await ask(broker, S.approvals_list, {"runId": "run_1"})
        assert listed == {"ok": True, "data": {"approvals": []}}
        decided = await ask(
            broker, S.approvals_decide, {"approvalId": "apr_1", "approve": False, "reason": "no"}
        )
        assert decided == {"ok": True, "data": {"approvalId": "apr_1", "decision": "denied"}}
        assert logic.calls[-1][1][1]["decider"] == "anonymous"
        await ask(broker, S.approvals_decide, {"approvalId": "apr_1", "approve": False, "decider": "alice"})
        assert logic.calls[-1][1][1]["decider"] == "claimed:alice"  # the client's word, marked so
        strict = await ask(broker, S.approvals_decide, {"approvalId": "apr_1", "approve": "yes"})
        assert strict["error"]["code"] == "invalidRequest" and strict["error"]["details"] == {
            "field": "approve"
        }
        logic.answers["decide"] = Conflict("Approval 'apr_1' was already decided.")
        second = await ask(broker, S.approvals_decide, {"approvalId": "apr_1", "approve": True})
        assert second["error"] == {"code": "conflict", "message": "Approval 'apr_1' was already decided."}

        closed = {"runId": "run_1", "toolsetId": TS, "callIds": []}
        await command(broker, bus, S.internal_runs_closed, json.dumps(closed).encode())
        await command(broker, bus, S.internal_approval_requests, b"{nope")
        assert logic.calls[-1] == ("close_run", "run_1")
        assert dead == [b"{nope"]


# ---- credentials -------------------------------------------------------------------------------


async def test_credentials_subjects_parse_call_and_reply_without_echoing_secrets() -> None:
    logic = Recorder(
        set_toolset=CredentialsSetReply(level="toolset"), set_run=NotFound("Run 'run_9' does not exist.")
    )
    secret = "Bearer tok-very-secret"
    creds = {"servers": {"gh": {"headers": {"Authorization": secret}}}}
    async with serving(credentials_routes, logic) as (broker, bus, _):
        ok = await ask(broker, S.toolsets_credentials_set, {"toolsetId": TS, "credentials": creds})
        assert ok == {"ok": True, "data": {"level": "toolset"}}
        missing = await ask(broker, S.runs_credentials_set, {"runId": "run_9", "credentials": creds})
        assert missing["error"]["code"] == "notFound"
        bad = await ask(broker, S.namespaces_credentials_set, {"namespace": "u", "credentials": creds})
        assert bad["error"]["details"] == {"field": "toolsetId"}
        assert secret not in json.dumps([ok, missing, bad])
        parked = {
            "callId": "call_1", "runId": "run_1", "toolsetId": TS, "server": "gh",
            "level": "toolset", "parkedAt": "2026-12-01T00:00:00.000Z",
        }  # fmt: skip
        await command(broker, bus, S.internal_calls_park, json.dumps(parked).encode())
        assert logic.calls[-1][0] == "park" and logic.calls[-1][1].namespace is None


# ---- the reply guard on the FastStream path -----------------------------------------------------


async def test_reply_guard_sends_unavailable_when_publishing_the_reply_fails() -> None:
    sent: list[bytes] = []

    async def publish(cmd: Any) -> None:
        if not sent and cmd.body == b'{"ok":true,"data":{}}':
            sent.append(b"<failed>")
            raise nats.errors.OutboundBufferLimitError
        sent.append(cmd.body)

    guard = ReplyGuard(None, context=None)  # type: ignore[arg-type]
    cmd = SimpleNamespace(publish_type=PublishType.REPLY, body=b'{"ok":true,"data":{}}')
    await guard.publish_scope(publish, cmd)
    assert sent[0] == b"<failed>"
    assert json.loads(sent[1])["error"]["code"] == "unavailable"

    other = SimpleNamespace(publish_type=PublishType.PUBLISH, body=b"x")
    failing = ReplyGuard(None, context=None)  # type: ignore[arg-type]

    async def broken(cmd: Any) -> None:
        raise nats.errors.OutboundBufferLimitError

    with pytest.raises(nats.errors.OutboundBufferLimitError):  # only replies are replaced
        await failing.publish_scope(broken, other)
