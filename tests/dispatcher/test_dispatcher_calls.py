"""The dispatcher's runs and calls against real NATS and Redis: the wire contract of runs.open,
runs.close, calls.start, calls.invoke and calls.get, events, slots, approvals and parking hooks.
Host tools are served by a worker in the test (a queue-group subscriber)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from toolbus_contracts import WORKER_QUEUE, CallEvent

from tests.dispatcher.test_dispatcher_helpers import Harness, host_tool, wait_until
from tests.support.commands import publish_command
from tests.support.infra import until

pytestmark = pytest.mark.integration

Work = Callable[[dict[str, Any]], Awaitable[Any]]


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def h(nats_url: str, redis_url: str) -> AsyncIterator[Harness]:
    harness = Harness(nats_url, redis_url)
    await harness.connect()
    await harness.dispatcher()
    try:
        yield harness
    finally:
        await harness.close()


class Worker:
    """A host-tool worker: runs `work(input)` per task, heartbeats, publishes the result."""

    def __init__(self, h: Harness, tool: str, work: Work) -> None:
        self.h = h
        self.tool = tool
        self.work = work
        self.tasks: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._sub: Subscription | None = None
        self._running: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Worker:
        assert self.h.nc is not None
        self._sub = await self.h.nc.subscribe(
            self.h.subjects.host_call(self.tool), queue=WORKER_QUEUE, cb=self._on_task
        )
        await self.h.nc.flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
        for task in self._running:
            task.cancel()

    async def _on_task(self, msg: Msg) -> None:
        task = asyncio.create_task(self._run(json.loads(msg.data)))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, task: dict[str, Any]) -> None:
        assert self.h.nc is not None
        self.tasks.append(task)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            try:
                body: dict[str, Any] = {"attempt": task["attempt"], "output": await self.work(task["input"])}
            except RuntimeError as exc:
                body = {"attempt": task["attempt"], "error": {"message": str(exc)}}
        finally:
            self.in_flight -= 1
        await self.h.nc.publish(self.h.subjects.host_result(task["callId"]), json.dumps(body).encode())


async def echo(value: dict[str, Any]) -> Any:
    return {"echo": value}


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def ts(h: Harness) -> str:
    return await h.toolset(
        {
            "host": [
                {
                    "name": "crm.find",
                    "inputSchema": {
                        "type": "object",
                        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                        "required": ["query"],
                        "additionalProperties": False,
                    },
                },
                host_tool("slow"),
                host_tool("limited", concurrency=2),
                host_tool("quick"),
                host_tool("guarded", approval=True),
            ]
        }
    )


async def test_invoke_returns_the_host_tools_output(h: Harness, ts: str) -> None:
    run = await h.open_run(ts)
    async with Worker(h, "crm.find", echo):
        data = await h.invoke(run, "crm.find", {"query": "acme"})
    assert data["outcome"] == {"status": "ok", "output": {"echo": {"query": "acme"}}}
    assert data["callId"].startswith("call_") and data["idempotencyKey"]
    got = await h.ok(h.subjects.calls_get, {"callId": data["callId"]})
    assert got == {"callId": data["callId"], "state": "done", "attempts": 1, "outcome": data["outcome"]}


async def test_a_host_tool_error_is_tool_error(h: Harness, ts: str) -> None:
    run = await h.open_run(ts)

    async def boom(_: dict[str, Any]) -> Any:
        raise RuntimeError("no such customer")

    async with Worker(h, "crm.find", boom):
        data = await h.invoke(run, "crm.find", {"query": "x"})
    assert data["outcome"] == {
        "status": "error",
        "error": {"code": "toolError", "message": "no such customer"},
    }


async def test_calls_start_is_idempotent_per_run_and_key(h: Harness, ts: str) -> None:
    run = await h.open_run(ts)
    async with Worker(h, "crm.find", echo) as worker:
        body = {"runId": run, "tool": "crm.find", "input": {"query": "a"}, "idempotencyKey": "k-1"}
        first = await h.ok(h.subjects.calls_start, body)
        second = await h.ok(h.subjects.calls_start, body)
        assert first == second == {"callId": first["callId"], "idempotencyKey": "k-1"}
        await h.wait_state(first["callId"], "done")
        again = await h.invoke(run, "crm.find", {"query": "a"}, idempotencyKey="k-1")
        assert again["callId"] == first["callId"]
        assert again["outcome"]["status"] == "ok"
    assert len(worker.tasks) == 1
    generated = await h.ok(
        h.subjects.calls_start, {"runId": run, "tool": "crm.find", "input": {"query": "b"}}
    )
    assert len(generated["idempotencyKey"]) >= 16


async def test_a_key_naming_another_call_is_conflict_and_registers_nothing(h: Harness, ts: str) -> None:
    run = await h.open_run(ts)
    release = asyncio.Event()

    async def held(value: dict[str, Any]) -> Any:
        await release.wait()
        return {"echo": value}

    async with Worker(h, "crm.find", held) as worker:
        body = {
            "runId": run,
            "tool": "crm.find",
            "input": {"query": "a", "limit": 2},
            "idempotencyKey": "k-2",
        }
        first = await h.ok(h.subjects.calls_start, body)
        # The same input with its keys in another order is the same call.
        reordered = {**body, "input": {"limit": 2, "query": "a"}}
        assert await h.ok(h.subjects.calls_start, reordered) == first
        for subject in (h.subjects.calls_start, h.subjects.calls_invoke):
            for other in (
                {**body, "input": {"query": "b", "limit": 2}},
                {**body, "input": {"query": "a", "limit": 3}},
                {**body, "tool": "quick", "input": {}},
            ):
                reply = await h.request(subject, other)
                assert reply["ok"] is False and reply["error"]["code"] == "conflict", reply
                assert reply["error"]["details"] == {"idempotencyKey": "k-2", "callId": first["callId"]}
        assert h.redis is not None
        # The call is still running: no conflicting invoke was registered to get its outcome.
        assert await h.redis.llen(h.keys.call_replies(first["callId"])) == 0
        waiting = asyncio.create_task(
            h.invoke(run, "crm.find", {"limit": 2, "query": "a"}, idempotencyKey="k-2")
        )
        redis = h.redis

        async def registered() -> bool:
            return bool(await redis.llen(h.keys.call_replies(first["callId"])))

        await until(registered, "the invoke registered")
        release.set()
        done = await waiting
        assert done["callId"] == first["callId"] and done["outcome"]["output"] == {
            "echo": {"query": "a", "limit": 2}
        }
    assert [t["callId"] for t in worker.tasks if t["runId"] == run] == [first["callId"]]
    assert await h.redis.scard(h.keys.run_calls(run)) == 1


async def test_refusals_create_no_call(h: Harness, ts: str) -> None:
    run = await h.open_run(ts)
    unknown = await h.request(h.subjects.calls_start, {"runId": run, "tool": "crm.nope", "input": {}})
    assert unknown["ok"] is False and unknown["error"]["code"] == "unknownTool"
    assert "crm.nope" in unknown["error"]["message"]
    bad = await h.request(h.subjects.calls_invoke, {"runId": run, "tool": "crm.find", "input": {"query": 3}})
    assert bad["error"]["code"] == "invalidInput"
    assert bad["error"]["details"]["path"] == "$.query"
    missing = await h.request(h.subjects.calls_start, {"runId": run, "tool": "crm.find", "input": {}})
    assert missing["error"]["code"] == "invalidInput" and missing["error"]["details"]["path"] == "$.query"
    assert "$.query" in missing["error"]["message"]
    assert h.redis is not None
    assert await h.redis.scard(h.keys.run_calls(run)) == 0


async def test_malformed_bodies_are_invalid_request_naming_the_field(h: Harness, ts: str) -> None:
    garbage = await h.request(h.subjects.calls_start, b"{not json")
    assert garbage["error"]["code"] == "invalidRequest"
    extra = await h.request(h.subjects.calls_start, {"runId": "r", "tool": "t", "input": {}, "colour": 1})
    assert extra["error"]["code"] == "invalidRequest" and extra["error"]["details"]["field"] == "colour"
    wrong = await h.request(h.subjects.calls_invoke, {"runId": "r", "tool": "t", "input": []})
    assert wrong["error"]["code"] == "invalidRequest" and wrong["error"]["details"]["field"] == "input"
    missing = await h.request(h.subjects.runs_open, {})
    assert missing["error"]["details"]["field"] == "toolsetId"


@pytest.mark.parametrize(
    "key",
    [
        "a\r\nX-Injected: 1",
        "a\nb",
        "a\x00b",
        "\u00e9t\u00e9",
        "\U0001f600",
        "a b",
        "a\tb",
        "\x7f",
        "k" * 257,
        "",
    ],
)
async def test_idempotency_keys_outside_printable_ascii_are_invalid_request(
    h: Harness, ts: str, key: str
) -> None:
    """The key travels as an HTTP header (`Idempotency-Key`): 1-256 printable ASCII characters,
    no space; anything else is refused before a call exists (no attempt retried as a network
    fault, no `internal`, no mojibake header)."""
    run = await h.open_run(ts)
    for subject in (h.subjects.calls_start, h.subjects.calls_invoke):
        body = {"runId": run, "tool": "crm.find", "input": {"query": "a"}, "idempotencyKey": key}
        bad = await h.request(subject, body)
        assert bad["ok"] is False and bad["error"]["code"] == "invalidRequest", bad
        assert bad["error"]["details"] == {"field": "idempotencyKey"}
    assert h.redis is not None
    assert await h.redis.scard(h.keys.run_calls(run)) == 0


async def test_idempotency_keys_of_any_printable_ascii_are_taken(h: Harness, ts: str) -> None:
    run = await h.open_run(ts)
    async with Worker(h, "crm.find", echo):
        for key in ("k" * 256, "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "0b3e9c1e-7f7e-4a8e-9d3c-6b2f0c1a9e11"):
            data = await h.invoke(run, "crm.find", {"query": "a"}, idempotencyKey=key)
            assert data["idempotencyKey"] == key and data["outcome"]["status"] == "ok"


async def test_unknown_or_closed_runs_are_not_found(h: Harness, ts: str) -> None:
    nope = await h.request(
        h.subjects.calls_start, {"runId": "no-such-run", "tool": "crm.find", "input": {"query": "a"}}
    )
    assert nope["error"]["code"] == "notFound"
    run = await h.open_run(ts)
    closed = await h.ok(h.subjects.runs_close, {"runId": run})
    assert closed == {"runId": run, "cancelled": 0}
    after = await h.request(
        h.subjects.calls_invoke, {"runId": run, "tool": "crm.find", "input": {"query": "a"}}
    )
    assert after["error"]["code"] == "notFound"
    assert "was closed; open a run with a new id" in after["error"]["message"]  # runs.open would conflict
    assert "open it with runs.open" in nope["error"]["message"]
    unknown_ts = await h.request(h.subjects.runs_open, {"toolsetId": "ts_" + "0" * 64})
    assert unknown_ts["error"]["code"] == "notFound"
    unknown_close = await h.request(h.subjects.runs_close, {"runId": "never-opened"})
    assert unknown_close["error"]["code"] == "notFound"


async def test_runs_open_is_a_noop_again_and_conflicts_with_another_toolset_or_namespace(
    h: Harness, ts: str
) -> None:
    other = await h.toolset({"host": [host_tool("other")]})
    run = await h.open_run(ts, runId="fixed-run-1", namespace="user-42")
    assert run == "fixed-run-1"
    assert await h.open_run(ts, runId="fixed-run-1") == "fixed-run-1"
    assert await h.open_run(ts, runId="fixed-run-1", namespace="user-42") == "fixed-run-1"
    clash = await h.request(h.subjects.runs_open, {"toolsetId": other, "runId": "fixed-run-1"})
    assert clash["error"]["code"] == "conflict"
    # Its calls resolve user-42's credentials: another namespace is not the same run.
    for namespace in ("user-43", "USER-42"):
        body = {"toolsetId": ts, "runId": "fixed-run-1", "namespace": namespace}
        clash = await h.request(h.subjects.runs_open, body)
        assert clash["error"]["code"] == "conflict" and "namespace" in clash["error"]["message"]
    unnamed = await h.open_run(ts, runId="fixed-run-2")
    clash = await h.request(h.subjects.runs_open, {"toolsetId": ts, "runId": unnamed, "namespace": "user-42"})
    assert clash["error"]["code"] == "conflict"


async def test_events_are_published_in_order(h: Harness, ts: str) -> None:
    run = await h.open_run(ts)
    async with h.events(run) as seen, Worker(h, "crm.find", echo):
        data = await h.invoke(run, "crm.find", {"query": "e"})
        await wait_until(lambda: len(seen) >= 3, what="three events")
    assert [e["type"] for e in seen] == ["accepted", "attemptStarted", "completed"]
    for event in seen:
        CallEvent.model_validate(event)
        assert event["callId"] == data["callId"] and event["runId"] == run
    assert seen[1]["attempt"] == 1
    assert seen[2]["outcome"] == data["outcome"]


async def test_a_run_never_has_more_than_16_running_and_tools_keep_their_limit(h: Harness, ts: str) -> None:
    run = await h.open_run(ts)
    gate = asyncio.Event()

    async def slow(_: dict[str, Any]) -> Any:
        await asyncio.sleep(0.01)
        return "ok"

    async def limited(_: dict[str, Any]) -> Any:
        await gate.wait()
        return "ok"

    async with (
        Worker(h, "slow", slow) as sw,
        Worker(h, "limited", limited) as lw,
        Worker(h, "quick", echo) as qw,
    ):
        limited_calls = [asyncio.create_task(h.invoke(run, "limited", {"i": i})) for i in range(6)]
        await wait_until(lambda: lw.in_flight == 2, what="two limited calls running")
        # Calls of another tool behind the blocked ones are not held up by the tool's limit.
        quick = await h.invoke(run, "quick", {"x": 1})
        assert quick["outcome"]["status"] == "ok"
        slow_calls = await asyncio.gather(*(h.invoke(run, "slow", {"i": i}) for i in range(100)))
        gate.set()
        limited_results = await asyncio.gather(*limited_calls)
    assert all(r["outcome"] == {"status": "ok", "output": "ok"} for r in slow_calls)
    assert len(sw.tasks) == 100
    assert all(r["outcome"]["status"] == "ok" for r in limited_results)
    assert lw.max_in_flight == 2
    assert sw.max_in_flight + 2 <= 16
    assert qw.tasks


async def test_close_cancels_waiting_and_running_calls(h: Harness, ts: str) -> None:
    run = await h.open_run(ts)
    never = asyncio.Event()

    async def hang(_: dict[str, Any]) -> Any:
        await never.wait()

    async with Worker(h, "limited", hang) as worker:
        starts = [
            await h.ok(h.subjects.calls_start, {"runId": run, "tool": "limited", "input": {"i": i}})
            for i in range(4)
        ]
        waiter = asyncio.create_task(h.invoke(run, "limited", {"i": 99}))
        await wait_until(lambda: worker.in_flight == 2, what="two running")
        assert (await h.ok(h.subjects.calls_get, {"callId": starts[3]["callId"]}))["state"] == "waitingSlot"
        closed = await h.ok(h.subjects.runs_close, {"runId": run})
        assert closed == {"runId": run, "cancelled": 5}
        invoked = await waiter
    assert invoked["outcome"]["error"]["code"] == "cancelled"
    closed_msg = await h.first_internal(h.subjects.internal_runs_closed, "runId", run)
    assert closed_msg["toolsetId"] == ts and len(closed_msg["callIds"]) == 5
    for start in starts:
        got = await h.ok(h.subjects.calls_get, {"callId": start["callId"]})
        assert got["state"] == "done" and got["outcome"]["error"]["code"] == "cancelled"


async def _internal(h: Harness, subject: str, body: dict[str, Any]) -> None:
    assert h.nc is not None
    await publish_command(h.nc.jetstream(), subject, json.dumps(body).encode())


async def test_approval_approved_runs_the_call_once(h: Harness, ts: str) -> None:
    run = await h.open_run(ts, namespace="user-7")
    async with h.events(run) as seen, Worker(h, "guarded", echo) as worker:
        started = await h.ok(
            h.subjects.calls_start, {"runId": run, "tool": "guarded", "input": {"amount": 5}}
        )
        await h.wait_state(started["callId"], "awaitingApproval")
        needed = await _last_needed(h, started["callId"])
        assert needed["namespace"] == "user-7" and needed["tool"] == "guarded"
        decided = {
            "approvalId": needed["approvalId"],
            "callId": started["callId"],
            "runId": run,
            "toolsetId": ts,
            "tool": "guarded",
            "inputDigest": needed["inputDigest"],
            "decision": "approved",
        }
        # A decision whose digest does not match is ignored.
        await _internal(h, h.subjects.internal_approval_decisions, {**decided, "inputDigest": "0" * 64})
        await _internal(h, h.subjects.internal_approval_decisions, decided)
        await h.wait_state(started["callId"], "done")
        await _internal(h, h.subjects.internal_approval_decisions, decided)  # a repeat changes nothing
        await wait_until(lambda: len(seen) >= 5, what="events")
    assert [e["type"] for e in seen] == [
        "accepted",
        "approvalRequested",
        "approved",
        "attemptStarted",
        "completed",
    ]
    assert seen[1]["approvalId"] == needed["approvalId"]
    assert len(worker.tasks) == 1


async def _last_needed(h: Harness, call_id: str) -> dict[str, Any]:
    assert h.nc is not None
    js = h.nc.jetstream()
    sub = await js.subscribe(h.subjects.internal_approval_requests, ordered_consumer=True)
    try:
        while True:
            msg = await sub.next_msg(timeout=10)
            body: dict[str, Any] = json.loads(msg.data)
            if body["callId"] == call_id:
                return body
    finally:
        await sub.unsubscribe()


async def test_approval_denied_ends_with_the_reason(h: Harness, ts: str) -> None:
    run = await h.open_run(ts)
    waiter = asyncio.create_task(h.invoke(run, "guarded", {"amount": 1}))
    needed = await _first_needed_for_run(h, run)
    await _internal(
        h,
        h.subjects.internal_approval_decisions,
        {
            "approvalId": needed["approvalId"],
            "callId": needed["callId"],
            "runId": run,
            "toolsetId": ts,
            "tool": "guarded",
            "inputDigest": needed["inputDigest"],
            "decision": "denied",
            "reason": "too risky",
        },
    )
    data = await waiter
    assert data["outcome"] == {"status": "error", "error": {"code": "denied", "message": "too risky"}}


async def test_an_input_too_large_for_its_approval_is_refused_and_the_dispatcher_answers_on(
    h: Harness, ts: str
) -> None:
    """The approval command carries the input: one that would not fit in a NATS message with its
    fields is refused before anything is stored (it would never reach the approval service, and
    near the limit its header would have made the server close the relay's connection)."""
    assert h.nc is not None
    run = await h.open_run(ts)
    body = {"runId": run, "tool": "guarded", "input": {"note": ""}}
    room = h.nc.max_payload - len(json.dumps(body)) - 64
    for size in (room - 400, room - 25_000):
        reply = await h.request(h.subjects.calls_start, {**body, "input": {"note": "x" * size}})
        if size == room - 400:
            assert reply["ok"] is False and reply["error"]["code"] == "invalidRequest", reply
            assert reply["error"]["details"]["field"] == "input"
            assert reply["error"]["details"]["limit"] < h.nc.max_payload
        else:
            assert reply["ok"] is True, reply  # within the limit: stored and sent for approval
            needed = await _first_needed_for_run(h, run)
            assert needed["callId"] == reply["data"]["callId"]
    async with Worker(h, "quick", echo):
        data = await h.invoke(run, "quick", {"after": "the refusal"})
    assert data["outcome"]["status"] == "ok"


async def test_an_integer_beyond_64_bits_in_an_input_is_invalid_request_naming_it(
    h: Harness, ts: str
) -> None:
    assert h.nc is not None
    run = await h.open_run(ts)
    raw = (
        b'{"runId": "%s", "tool": "quick", "input": {"a": {"b": 123456789012345678901234567890}}}'
        % run.encode()
    )
    for subject in (h.subjects.calls_start, h.subjects.calls_invoke):
        reply = json.loads((await h.nc.request(subject, raw, timeout=10)).data)
        assert reply["ok"] is False and reply["error"]["code"] == "invalidRequest", reply
        assert reply["error"]["details"] == {"field": "input.a.b"}


async def _first_needed_for_run(h: Harness, run: str) -> dict[str, Any]:
    return await h.first_internal(h.subjects.internal_approval_requests, "runId", run)
