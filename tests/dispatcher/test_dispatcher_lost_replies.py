"""Store steps whose reply was lost, against a real dispatcher, real NATS and a real Redis behind a
proxy that drops one answer and closes the connection (`tests/support/cutting_proxy.py`): the
script ran, the dispatcher cannot tell, and its retry must answer the same and finish the job.

- `finish`: the calls the first run admitted into the freed slot are handed over again and run at
  once (attempt 1), instead of sitting `running` with nobody running them until their lease lapsed
  (and then resumed as interrupted: `outcomeUnknown` for an `at_most_once` tool never sent).
- `create` (`calls.start` answered `unavailable`, the client sends it again): the call admitted
  by the first create runs, once.
- an approval decision applied (`release_waiting`): an approved call admitted by the first run
  runs once, attempt 1; a denied call's waiting invoker is answered.
- `park` (a 401): the retry announces the park (`CallParked`), which the first run never got to.
- `runs.close` retried after its first run's follow-up was lost: same answer, waiting invokers
  answered, run credentials deleted, and the `RunClosed` command in JetStream exactly once.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common.clock import now_iso
from toolbus_dispatcher.app import pipe_reply_timeout
from toolbus_dispatcher.credentials import StaticCredentials
from toolbus_dispatcher.service import CANCELLED_JSON
from toolbus_dispatcher.store import CLOSE_CLAIM, CallStore

from tests.dispatcher.test_dispatcher_calls import Worker
from tests.dispatcher.test_dispatcher_helpers import Harness, host_tool, wait_until
from tests.dispatcher.test_dispatcher_mcp import mcp_toolset
from tests.support.commands import publish_command
from tests.support.cutting_proxy import CuttingProxy, proxy_to
from tests.support.infra import js_name
from tests.support.mcp_servers import McpTestServer

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def proxy(redis_url: str) -> AsyncIterator[CuttingProxy]:
    async with proxy_to(redis_url) as p:
        yield p


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def creds() -> StaticCredentials:
    return StaticCredentials()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def h(
    nats_url: str, redis_url: str, proxy: CuttingProxy, creds: StaticCredentials
) -> AsyncIterator[Harness]:
    harness = Harness(nats_url, redis_url)
    await harness.connect()
    # A lease long enough that a retried store step (its reply cut, a new connection, the script
    # again) always comes inside it, even on a loaded machine: these tests check the hand-over,
    # and a lapsed lease would hide it (the calls then resume as interrupted).
    await harness.dispatcher(credentials=creds, redis_url=proxy.url, dispatcher_lease=6.0)
    try:
        yield harness
    finally:
        await harness.close()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def ts(h: Harness) -> str:
    return await h.toolset(
        {
            "host": [
                host_tool("one", concurrency=1, onInterruption="at_most_once"),
                host_tool("hang"),
                host_tool("guarded", approval=True, onInterruption="at_most_once"),
            ]
        }
    )


def _store(h: Harness) -> CallStore:
    service = h.apps[0].service
    assert service is not None
    return service._store


class Gates:
    """A host tool that answers `ok` once its input's gate opens."""

    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Event] = {}

    def gate(self, i: int) -> asyncio.Event:
        return self.gates.setdefault(i, asyncio.Event())

    async def work(self, value: dict[str, Any]) -> Any:
        await self.gate(int(value["i"])).wait()
        return "ok"


async def test_a_finish_whose_reply_was_lost_hands_the_freed_slot_over_at_once(
    h: Harness, ts: str, proxy: CuttingProxy
) -> None:
    run = await h.open_run(ts)
    gates = Gates()
    async with Worker(h, "one", gates.work) as worker:
        first = await h.ok(h.subjects.calls_start, {"runId": run, "tool": "one", "input": {"i": 0}})
        await wait_until(lambda: len(worker.tasks) == 1, what="the first call running")
        second = await h.ok(h.subjects.calls_start, {"runId": run, "tool": "one", "input": {"i": 1}})
        await h.wait_state(second["callId"], "waitingSlot")
        cuts = proxy.cuts
        proxy.arm(_store(h)._finish.sha.encode())
        gates.gate(0).set()
        gates.gate(1).set()
        await h.wait_state(second["callId"], "done")
    assert proxy.cuts == cuts + 1  # the first call's finish ran, and its answer was lost
    for started in (first, second):
        got = await h.ok(h.subjects.calls_get, {"callId": started["callId"]})
        assert got["outcome"] == {"status": "ok", "output": "ok"} and got["attempts"] == 1, got
    # The second call was sent once, as its first attempt: not left to its lease and then ended
    # `outcomeUnknown` as an interrupted at_most_once call.
    assert [(t["callId"], t["attempt"]) for t in worker.tasks] == [
        (first["callId"], 1),
        (second["callId"], 1),
    ]
    assert h.redis is not None
    assert await h.redis.zcard(h.keys.run_slots(run)) == 0  # no slot left behind


async def test_a_create_whose_reply_was_lost_runs_the_call_once_when_sent_again(
    h: Harness, ts: str, proxy: CuttingProxy
) -> None:
    run = await h.open_run(ts)
    gates = Gates()
    gates.gate(5).set()
    key = uuid.uuid4().hex
    body = {"runId": run, "tool": "one", "input": {"i": 5}, "idempotencyKey": key}
    async with Worker(h, "one", gates.work) as worker:
        cuts = proxy.cuts
        proxy.arm(_store(h)._create.sha.encode())
        lost = await h.request(h.subjects.calls_start, body)
        assert proxy.cuts == cuts + 1
        assert not lost["ok"] and lost["error"]["code"] == "unavailable", lost
        again = await h.ok(h.subjects.calls_start, body)
        got = await h.wait_state(again["callId"], "done")
    assert got["outcome"] == {"status": "ok", "output": "ok"} and got["attempts"] == 1, got
    assert [(t["callId"], t["attempt"]) for t in worker.tasks] == [(again["callId"], 1)]


async def _run_closed_messages(h: Harness, run: str) -> list[dict[str, Any]]:
    """Every `RunClosed` command for `run` in the INTERNAL stream (after the relay emptied the outbox)."""
    relay = h.apps[0].relay
    assert relay is not None and h.nc is not None
    await wait_until(lambda: _empty(relay), what="the outbox relayed")
    sub = await h.nc.jetstream().subscribe(
        h.subjects.internal_runs_closed, stream=js_name(h.prefix, "INTERNAL"), ordered_consumer=True
    )
    found: list[dict[str, Any]] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1)
            except TimeoutError:
                return found
            body: dict[str, Any] = json.loads(msg.data)
            if body["runId"] == run:
                found.append(body)
    finally:
        await sub.unsubscribe()


async def _empty(relay: Any) -> bool:
    return int(await relay.pending()) == 0


async def test_a_retried_close_answers_the_same_and_finishes_what_the_first_left(
    h: Harness, ts: str, creds: StaticCredentials
) -> None:
    run = await h.open_run(ts)
    creds.set("run", run, {"s": {"Authorization": "Bearer x"}})
    never = asyncio.Event()

    async def hang(_: dict[str, Any]) -> Any:
        await never.wait()

    async with Worker(h, "one", hang) as worker:
        await h.ok(h.subjects.calls_start, {"runId": run, "tool": "one", "input": {"i": 0}})
        await wait_until(lambda: worker.in_flight == 1, what="one running")
        waiter = asyncio.create_task(h.invoke(run, "one", {"i": 1}))
        # The first close: its script ran, then the dispatcher died before anything else (no
        # replies to invokers, no credentials deleted).
        await wait_until(lambda: _has_waiting(h, run), what="the invoke waiting for the slot")
        first = await _store(h).close_run(run, now_iso(), CANCELLED_JSON, 60)
        assert first.status == "closed" and len(first.cancelled) == 2
        assert ("run", run) in creds.levels and not waiter.done()
        again = await h.ok(h.subjects.runs_close, {"runId": run})
        assert again == {"runId": run, "cancelled": 2}
        invoked = await waiter
        assert invoked["outcome"]["error"]["code"] == "cancelled"
        assert ("run", run) not in creds.levels
        assert await h.ok(h.subjects.runs_close, {"runId": run}) == again
    messages = await _run_closed_messages(h, run)
    assert len(messages) == 1, messages
    assert messages[0]["toolsetId"] == ts and len(messages[0]["callIds"]) == 2


async def _has_waiting(h: Harness, run: str) -> bool:
    assert h.redis is not None
    return int(await h.redis.zcard(h.keys.run_waiting(run))) == 1


async def test_a_run_closed_without_its_command_gets_it_on_the_next_close_once(h: Harness, ts: str) -> None:
    # A run an older dispatcher closed (state changed, its RunClosed publish lost): the next close
    # queues the command, once.
    run = await h.open_run(ts)
    assert h.redis is not None
    await h.redis.hset(h.keys.run(run), mapping={"state": "closed", "closedAt": now_iso()})
    for _ in range(2):
        assert await h.ok(h.subjects.runs_close, {"runId": run}) == {"runId": run, "cancelled": 0}
    messages = await _run_closed_messages(h, run)
    assert [m["callIds"] for m in messages] == [[]]


async def test_a_park_whose_reply_was_lost_is_announced_when_retried(
    h: Harness, proxy: CuttingProxy, creds: StaticCredentials
) -> None:
    async with McpTestServer(name="guarded", required_token="good-token") as srv:
        run = await h.open_run(await mcp_toolset(h, srv.url, name="crm"))
        creds.set("run", run, {"crm": {"Authorization": "Bearer stale-token"}})
        park = _store(h)._park
        assert h.redis is not None
        await h.redis.script_load(park.script)  # type: ignore[attr-defined,no-untyped-call]
        cuts = proxy.cuts
        proxy.arm(park.sha.encode())  # type: ignore[attr-defined]
        started = await h.ok(
            h.subjects.calls_start, {"runId": run, "tool": "crm.echo", "input": {"text": "p"}}
        )
        got = await h.wait_state(started["callId"], "parked")
        assert got["attempts"] == 0
        parked = await h.first_internal(h.subjects.internal_calls_park, "callId", started["callId"])
    assert proxy.cuts == cuts + 1
    assert parked["server"] == "crm" and parked["level"] == "run" and parked["runId"] == run


async def test_a_finish_whose_answer_never_comes_is_retried_after_the_reply_timeout(
    h: Harness, ts: str, proxy: CuttingProxy
) -> None:
    # The connection stays open and silent (no reset): the dispatcher cannot tell the script ran.
    # The pipe gives up on it after its reply timeout, a quarter of the lease (1.5 s here), and
    # the retry hands the slot over as above, well before the admitted call's lease could lapse.
    pipe = h.apps[0]._pipe
    assert pipe is not None
    assert pipe.reply_timeout == pipe_reply_timeout(h.apps[0].settings) == 1.5
    run = await h.open_run(ts)
    gates = Gates()
    async with Worker(h, "one", gates.work) as worker:
        first = await h.ok(h.subjects.calls_start, {"runId": run, "tool": "one", "input": {"i": 0}})
        await wait_until(lambda: len(worker.tasks) == 1, what="the first call running")
        second = await h.ok(h.subjects.calls_start, {"runId": run, "tool": "one", "input": {"i": 1}})
        await h.wait_state(second["callId"], "waitingSlot")
        cuts = proxy.cuts
        proxy.arm(_store(h)._finish.sha.encode(), stall=True)
        gates.gate(0).set()
        gates.gate(1).set()
        await h.wait_state(second["callId"], "done", within=30)
    assert proxy.cuts == cuts + 1
    for started in (first, second):
        got = await h.ok(h.subjects.calls_get, {"callId": started["callId"]})
        assert got["outcome"] == {"status": "ok", "output": "ok"} and got["attempts"] == 1, got
    assert [(t["callId"], t["attempt"]) for t in worker.tasks] == [
        (first["callId"], 1),
        (second["callId"], 1),
    ]


async def _needed(h: Harness, call_id: str) -> dict[str, Any]:
    return await h.first_internal(h.subjects.internal_approval_requests, "callId", call_id)


async def _decide(h: Harness, needed: dict[str, Any], ts: str, decision: str) -> None:
    assert h.nc is not None
    body = {
        "approvalId": needed["approvalId"],
        "callId": needed["callId"],
        "runId": needed["runId"],
        "toolsetId": ts,
        "tool": "guarded",
        "inputDigest": needed["inputDigest"],
        "decision": decision,
        "reason": "no",
    }
    await publish_command(h.nc.jetstream(), h.subjects.internal_approval_decisions, json.dumps(body).encode())


async def _arm_release(h: Harness, proxy: CuttingProxy) -> int:
    release = _store(h)._release
    assert h.redis is not None
    await h.redis.script_load(release.script)  # type: ignore[attr-defined,no-untyped-call]
    cuts = proxy.cuts
    proxy.arm(release.sha.encode())  # type: ignore[attr-defined]
    return cuts


async def test_an_approval_whose_reply_was_lost_runs_the_approved_call_once(
    h: Harness, ts: str, proxy: CuttingProxy
) -> None:
    run = await h.open_run(ts)
    gates = Gates()
    gates.gate(7).set()
    async with Worker(h, "guarded", gates.work) as worker:
        started = await h.ok(h.subjects.calls_start, {"runId": run, "tool": "guarded", "input": {"i": 7}})
        needed = await _needed(h, started["callId"])
        cuts = await _arm_release(h, proxy)
        await _decide(h, needed, ts, "approved")
        got = await h.wait_state(started["callId"], "done", within=30)
    assert proxy.cuts == cuts + 1
    assert got["outcome"] == {"status": "ok", "output": "ok"} and got["attempts"] == 1, got
    assert [(t["callId"], t["attempt"]) for t in worker.tasks] == [(started["callId"], 1)]


async def test_a_denial_whose_reply_was_lost_still_answers_the_waiting_invoker(
    h: Harness, ts: str, proxy: CuttingProxy
) -> None:
    run = await h.open_run(ts)
    waiter = asyncio.create_task(h.invoke(run, "guarded", {"i": 8}, idempotencyKey="deny-lost"))
    needed = await h.first_internal(h.subjects.internal_approval_requests, "runId", run)
    cuts = await _arm_release(h, proxy)
    await _decide(h, needed, ts, "denied")
    data = await waiter
    assert proxy.cuts == cuts + 1
    assert data["outcome"] == {"status": "error", "error": {"code": "denied", "message": "no"}}


async def _waiting(h: Harness, run: str, n: int) -> bool:
    assert h.redis is not None
    return int(await h.redis.zcard(h.keys.run_waiting(run))) == n


async def _invoke_counting(h: Harness, run: str, tool: str, key: str) -> list[dict[str, Any]]:
    """Send `calls.invoke` on an inbox of its own and keep every reply it gets (not only the first)."""
    assert h.nc is not None
    replies: list[dict[str, Any]] = []

    async def got(msg: Any) -> None:
        replies.append(json.loads(msg.data))

    inbox = h.nc.new_inbox()
    await h.nc.subscribe(inbox, cb=got)
    body = {"runId": run, "tool": tool, "input": {"k": key}, "idempotencyKey": key}
    await h.nc.publish(h.subjects.calls_invoke, json.dumps(body).encode(), reply=inbox)
    return replies


async def test_a_close_repeated_answers_each_waiting_invoker_once(h: Harness, ts: str) -> None:
    """A second `runs.close` answered every cancelled call's invoker again: two replies to one
    `calls.invoke` (seen by an outside probe with sequential and with concurrent closes)."""
    never = asyncio.Event()

    async def hang(_: dict[str, Any]) -> Any:
        await never.wait()

    async with Worker(h, "one", hang) as worker:
        run = await h.open_run(ts)
        seen = [await _invoke_counting(h, run, "one", f"k{i}") for i in range(3)]
        await wait_until(lambda: worker.in_flight == 1, what="one running, two waiting for its slot")
        await wait_until(lambda: _waiting(h, run, 2), what="two waiting")
        closes = await asyncio.gather(*(h.ok(h.subjects.runs_close, {"runId": run}) for _ in range(3)))
        assert closes == [{"runId": run, "cancelled": 3}] * 3
        assert await h.ok(h.subjects.runs_close, {"runId": run}) == closes[0]
        await wait_until(lambda: all(seen), what="every invoker answered")
        await asyncio.sleep(0.3)  # room for a second reply, were one sent
    assert [len(r) for r in seen] == [1, 1, 1], seen
    assert all(r[0]["data"]["outcome"]["error"]["code"] == "cancelled" for r in seen)


async def test_another_dispatchers_live_claim_is_left_to_it_and_a_lapsed_one_is_taken_over(
    h: Harness, ts: str
) -> None:
    never = asyncio.Event()

    async def hang(_: dict[str, Any]) -> Any:
        await never.wait()

    assert h.redis is not None
    async with Worker(h, "one", hang) as worker:
        run = await h.open_run(ts)
        seen = await _invoke_counting(h, run, "one", "k")
        await wait_until(lambda: worker.in_flight == 1, what="running")
        # Another dispatcher's close ran its script and is (or was) answering the invokers.
        first = await _store(h).close_run(run, now_iso(), CANCELLED_JSON, 60)
        assert first.status == "closed" and first.cancelled[0][1]
        claim = await h.redis.hget(h.keys.run(run), "answering")
        assert claim is not None
        seconds, micros = await h.redis.time()  # the claim: CLOSE_CLAIM on from Redis TIME
        assert float(claim.rsplit(b"|", 1)[1]) == pytest.approx(seconds + micros / 1e6 + CLOSE_CLAIM, abs=2)
        await h.redis.hset(h.keys.run(run), "answering", "elsewhere|9999999999")
        assert await h.ok(h.subjects.runs_close, {"runId": run}) == {"runId": run, "cancelled": 1}
        await asyncio.sleep(0.3)
        assert seen == []  # left to the live claim
        await h.redis.hset(h.keys.run(run), "answering", "elsewhere|1")  # it died: its claim lapsed
        assert await h.ok(h.subjects.runs_close, {"runId": run}) == {"runId": run, "cancelled": 1}
        await wait_until(lambda: bool(seen), what="the invoker answered")
        assert await h.ok(h.subjects.runs_close, {"runId": run}) == {"runId": run, "cancelled": 1}
        await asyncio.sleep(0.3)
    assert len(seen) == 1 and seen[0]["data"]["outcome"]["error"]["code"] == "cancelled", seen
