"""The outbox relay (`toolbus_common.outbox`, the dispatcher's `EventRelay`) on a real Redis outbox and a real
JetStream: one relay at a time among several on one outbox, another taking over when the holder
stops or dies, and each call's events in the stream in the order of their `n`, with a call whose
event JetStream does not take held back (its later events stay in the outbox) while other calls'
events go on. The entries are written as the dispatcher's Lua scripts write them (`s` subject,
`i` message id, `b` body)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from nats.js.api import DiscardPolicy, StreamConfig
from toolbus_approval.app import ApprovalApp
from toolbus_approval.settings import ApprovalSettings
from toolbus_common import outbox as relay_module
from toolbus_common.in_flight import InFlight
from toolbus_common.script_pipe import ScriptPipe
from toolbus_common.settings import Settings
from toolbus_dispatcher.events import EventRelay, order_key

from tests.dispatcher.test_dispatcher_helpers import Harness, host_tool
from tests.support.commands import TEST_SECRET_KEY
from tests.support.infra import js_name, until

pytestmark = pytest.mark.integration

TTL = 1.5  # the relays' lock TTL here (the default is 3 s)


class Outbox:
    """One outbox (Redis stream) and one JetStream stream over `<prefix>.ev.>` of its own, and
    the relays started on it."""

    def __init__(self, nc: Any, redis: Any, prefix: str, redis_url: str) -> None:
        self.nc = nc
        self.redis = redis
        self.redis_url = redis_url
        self.pipes: list[ScriptPipe] = []
        tag = uuid.uuid4().hex[:8]
        self.key = f"{prefix}:relaytest:{tag}:outbox"
        self.subject = f"{prefix}.rt{tag}.ev"
        self.stream = js_name(prefix, f"RT{tag}")
        self.relays: list[EventRelay] = []
        self.tasks: dict[int, asyncio.Task[None]] = {}

    async def open(self, **config: Any) -> None:
        await self.nc.jetstream().add_stream(
            StreamConfig(name=self.stream, subjects=[f"{self.subject}.>"], **config)
        )

    def relay(self, invokes: InFlight | None = None) -> EventRelay:
        pipe = ScriptPipe(self.redis_url)  # each relay its own, as DispatcherApp does
        self.pipes.append(pipe)
        relay = EventRelay(
            self.redis,
            self.nc,
            self.key,
            f"d_{uuid.uuid4().hex[:8]}",
            lock=f"{self.key}:relay",
            lock_ttl=TTL,
            pipe=pipe,
            invokes=invokes,
        )
        self.relays.append(relay)
        self.tasks[id(relay)] = asyncio.create_task(relay.run())
        return relay

    async def kill(self, relay: EventRelay) -> None:
        """The relay's process died: its loop stops, nothing is released."""
        task = self.tasks.pop(id(relay))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def stop(self, relay: EventRelay) -> None:
        """An orderly stop, as `DispatcherApp.stop` does it: drain, release the lock."""
        await self.kill(relay)
        await relay.drain(within=2.0)

    async def add(self, call: str, n: int, *, subject: str | None = None) -> None:
        body = json.dumps({"type": "e", "callId": call, "n": n}).encode()
        await self.redis.xadd(
            self.key, {"s": subject or f"{self.subject}.run.{call}", "i": f"{call}:{n}", "b": body}
        )

    async def pending(self) -> list[str]:
        """Message ids still in the outbox, oldest first."""
        return [e[1][b"i"].decode() for e in await self.redis.xrange(self.key)]

    async def stored(self, stream: str | None = None) -> list[tuple[str, int]]:
        """(callId, n) of every message in the stream, in stream order."""
        js = self.nc.jetstream()
        name = stream or self.stream
        info = await js.stream_info(name)
        out: list[tuple[str, int]] = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(name, seq)
            body = json.loads(msg.data or b"{}")
            out.append((body["callId"], body["n"]))
        return out

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for relay in self.relays:
            await relay.release()
        for pipe in self.pipes:
            await pipe.aclose()
        await self.redis.delete(self.key, f"{self.key}:relay")


@pytest_asyncio.fixture(loop_scope="session")
async def box(nc: Any, redis_client: Any, prefix: str, redis_url: str) -> AsyncIterator[Outbox]:
    b = Outbox(nc, redis_client, prefix, redis_url)
    try:
        yield b
    finally:
        await b.close()


def per_call(stored: list[tuple[str, int]]) -> dict[str, list[int]]:
    calls: dict[str, list[int]] = {}
    for call, n in stored:
        calls.setdefault(call, []).append(n)
    return calls


def holders(box: Outbox) -> list[EventRelay]:
    return [r for r in box.relays if id(r) in box.tasks and r.holding]


def test_order_keys_group_a_call_with_its_commands() -> None:
    assert order_key("call_1:3") == "call_1"
    assert order_key("park:call_1:3") == "call_1"
    assert order_key("approvalNeeded:call_1") == "call_1"
    assert order_key("runClosed:run_9") == "runClosed:run_9"


async def test_two_relays_on_one_outbox_one_publishes(box: Outbox) -> None:
    await box.open()
    a, b = box.relay(), box.relay()
    await until(lambda: len(holders(box)) == 1, "one relay holding the lock")
    for i in range(40):
        for n in (1, 2, 3):
            await box.add(f"c{i}", n)
    await until(lambda: _empty(box), "the outbox relayed")
    assert sorted((a.relayed, b.relayed)) == [0, 120]
    assert (a.acquired, b.acquired).count(1) == 1 and (a.acquired, b.acquired).count(0) == 1
    stored = await box.stored()
    assert len(stored) == 120
    assert all(ns == [1, 2, 3] for ns in per_call(stored).values())


@pytest.mark.parametrize("how", ["stopped", "killed"])
async def test_the_other_relay_takes_over_when_the_holder_goes(box: Outbox, how: str) -> None:
    await box.open()
    box.relay(), box.relay()
    await until(lambda: len(holders(box)) == 1, "one relay holding the lock")
    holder = holders(box)[0]
    other = next(r for r in box.relays if r is not holder)
    await box.add("before", 1)
    await until(lambda: _empty(box), "the outbox relayed")
    if how == "stopped":
        await box.stop(holder)  # releases: the other takes it at its next try
    else:
        await box.kill(holder)  # holds on until the lock's TTL lapses
    for n in (1, 2, 3):
        await box.add("after", n)
    await until(lambda: _empty(box), "the outbox relayed by the other relay", limit=30)
    assert other.acquired == 1 and other.relayed == 3
    assert per_call(await box.stored()) == {"before": [1], "after": [1, 2, 3]}


async def test_a_call_whose_event_is_refused_waits_and_others_go_on(box: Outbox) -> None:
    # One message per subject, new ones refused: the second event of call `x` (and of `y`, a
    # call on the same subject) is refused by JetStream; `x`'s third must not be published before
    # it, while calls on other subjects go on.
    await box.open(max_msgs_per_subject=1, discard=DiscardPolicy.NEW, discard_new_per_subject=True)
    relay = box.relay()
    await until(lambda: relay.holding, "the relay holding the lock")
    for call in ("x", "a", "b"):
        await box.add(call, 1)
    await until(lambda: _empty(box), "the first events relayed")
    await box.add("x", 2)
    await box.add("a", 2, subject=f"{box.subject}.run.a2")
    await box.add("x", 3, subject=f"{box.subject}.run.x3")
    await box.add("b", 2, subject=f"{box.subject}.run.b2")
    await until(lambda: _pending_are(box, ["x:2", "x:3"]), "only x's refused event and the one after it left")
    assert per_call(await box.stored()) == {"x": [1], "a": [1, 2], "b": [1, 2]}
    # JetStream takes it again (the limit lifted): x's events go through, in order.
    js = box.nc.jetstream()
    info = await js.stream_info(box.stream)
    info.config.max_msgs_per_subject = -1
    info.config.discard_new_per_subject = False
    await js.update_stream(info.config)
    await until(lambda: _empty(box), "x's events relayed once JetStream takes them", limit=30)
    assert per_call(await box.stored()) == {"x": [1, 2, 3], "a": [1, 2], "b": [1, 2]}


async def test_events_no_stream_captures_wait_until_one_does(box: Outbox, nc: Any) -> None:
    # Call `late`'s subject is captured by no stream (a 503 to the publish): all its events stay
    # in the outbox, in order, while the other calls' events are relayed; once a stream captures
    # the subject they land there in order.
    await box.open()
    relay = box.relay()
    await until(lambda: relay.holding, "the relay holding the lock")
    late = f"{box.subject}x.run.late"
    for n in range(1, 6):
        await box.add("late", n, subject=late)
        for i in range(20):
            await box.add(f"c{i}", n)
    await until(
        lambda: _pending_are(box, [f"late:{n}" for n in range(1, 6)]), "all but late's events relayed"
    )
    calls = per_call(await box.stored())
    assert len(calls) == 20 and all(ns == [1, 2, 3, 4, 5] for ns in calls.values())
    other = box.stream + "X"
    await nc.jetstream().add_stream(StreamConfig(name=other, subjects=[f"{box.subject}x.>"]))
    await until(lambda: _empty(box), "late's events relayed once a stream captures them", limit=30)
    assert await box.stored(other) == [("late", n) for n in range(1, 6)]


async def test_many_calls_relayed_in_order_per_call(box: Outbox) -> None:
    # More entries than a batch, several events per call interleaved across calls and batches.
    await box.open()
    relay = box.relay()
    for n in range(1, 5):
        for i in range(300):
            await box.add(f"m{i}", n)
    await until(lambda: _empty(box), "the outbox relayed", limit=60)
    assert relay.relayed == 1200
    calls = per_call(await box.stored())
    assert len(calls) == 300 and all(ns == [1, 2, 3, 4] for ns in calls.values())


async def test_a_calls_first_events_wait_for_the_invokes_in_flight_never_for_ever(
    box: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small batch waits until this process's calls.invoke requests are answered (so that the
    # relay's publishing does not share the event loop with them), at most until DEFER seconds
    # after the newest came in.
    await box.open()
    invokes = InFlight()
    waiting = asyncio.Event()
    waits: list[float] = []
    idle = InFlight.idle

    async def spied(self: InFlight, within: float, loop: asyncio.AbstractEventLoop) -> None:
        waits.append(within)
        waiting.set()
        await idle(self, within, loop)

    monkeypatch.setattr(InFlight, "idle", spied)
    monkeypatch.setattr(relay_module, "DEFER", 30.0)
    box.relay(invokes)
    invokes.enter()
    await box.add("w1", 1)
    await asyncio.wait_for(waiting.wait(), 10)  # the relay read it and waits for the invoke
    await asyncio.sleep(0.2)
    assert await box.pending() == ["w1:1"]  # held back while the invoke is in flight
    invokes.leave()
    await until(lambda: _empty(box), "relayed once the invoke was answered", limit=10)
    # An invoke that never ends holds nothing back for longer than DEFER.
    monkeypatch.setattr(relay_module, "DEFER", 0.05)
    invokes.enter()
    for n in (1, 2, 3):
        await box.add("w2", n)
    await until(lambda: _empty(box), "relayed with an invoke still in flight", limit=10)
    # One in flight for longer than DEFER already (a slow tool) is not waited for at all.
    await asyncio.sleep(0.1)
    waits.clear()
    await box.add("w3", 1)
    await until(lambda: _empty(box), "relayed beside a slow invoke", limit=10)
    assert waits and all(w <= 0 for w in waits), waits
    assert per_call(await box.stored()) == {"w1": [1], "w2": [1, 2, 3], "w3": [1]}


async def _empty(box: Outbox) -> bool:
    return not await box.pending()


async def _pending_are(box: Outbox, ids: list[str]) -> bool:
    return await box.pending() == ids


# ---- ApprovalNeeded through the outbox ----------------------------------------------------------


async def _approval_commands(h: Harness, call_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(Nats-Msg-Id, body) of every ApprovalNeeded for `call_id` in the INTERNAL stream."""
    assert h.nc is not None
    js = h.nc.jetstream()
    stream = js_name(h.prefix, "INTERNAL")
    info = await js.stream_info(stream)
    found: list[tuple[str, dict[str, Any]]] = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        with contextlib.suppress(Exception):  # a gap (deleted message)
            msg = await js.get_msg(stream, seq)
            if msg.subject == h.subjects.internal_approval_requests:
                body = json.loads(msg.data or b"{}")
                if body.get("callId") == call_id:
                    found.append(((msg.headers or {}).get("Nats-Msg-Id", ""), body))
    return found


async def test_an_approval_request_stored_by_a_dispatcher_that_died_reaches_the_approval_service_once(
    nats_url: str, redis_url: str
) -> None:
    h = Harness(nats_url, redis_url)
    await h.connect()
    approvals: ApprovalApp | None = None
    try:
        first = await h.dispatcher(dispatcher_relay_lock_ttl=TTL)
        ts = await h.toolset({"host": [host_tool("guarded", approval=True)]})
        run = await h.open_run(ts)
        # The first dispatcher stores the call and then is dead to the outbox: its relay stopped
        # without a chance to send anything (as after a SIGKILL right after the store).
        assert first.relay is not None
        for task in first._loops:
            task.cancel()
        body = {"runId": run, "tool": "guarded", "input": {"i": 1}, "idempotencyKey": "k1"}
        started = await h.ok(h.subjects.calls_start, body)
        call_id = started["callId"]
        assert (await h.ok(h.subjects.calls_get, {"callId": call_id}))["state"] == "awaitingApproval"
        assert await _approval_commands(h, call_id) == []  # nothing sent: only the outbox has it
        assert h.redis is not None
        assert await h.redis.xlen(h.keys.call_events_outbox) > 0
        # The approval service and another dispatcher come up: the new one's relay takes the
        # lock once the dead one's lapsed, and sends the stored command.
        approvals = ApprovalApp(
            Settings(
                nats_url=nats_url, redis_url=redis_url, subject_prefix=h.prefix, secret_key=TEST_SECRET_KEY
            ),
            ApprovalSettings(approval_sweep_interval=0.05),
        )
        await approvals.start()
        await h.dispatcher(dispatcher_relay_lock_ttl=TTL)

        async def listed() -> list[dict[str, Any]]:
            reply = await h.ok(h.subjects.approvals_list, {"runId": run})
            out: list[dict[str, Any]] = reply["approvals"]
            return out

        async def one_listed() -> bool:
            return len(await listed()) == 1

        await until(one_listed, "the approval created from the outbox", limit=30)
        # The client retries calls.start (same key): nothing is sent again.
        again = await h.ok(h.subjects.calls_start, body)
        assert again["callId"] == call_id
        await until(lambda: _outbox_empty(h), "the outbox relayed")
        sent = await _approval_commands(h, call_id)
        assert [msg_id for msg_id, _ in sent] == [f"approvalNeeded:{call_id}"]
        assert sent[0][1]["tool"] == "guarded" and sent[0][1]["input"] == {"i": 1}
        (approval,) = await listed()
        assert approval["callId"] == call_id and approval["approvalId"] == sent[0][1]["approvalId"]
    finally:
        if approvals is not None:
            await approvals.stop()
        await h.close()


async def _outbox_empty(h: Harness) -> bool:
    assert h.redis is not None
    return int(await h.redis.xlen(h.keys.call_events_outbox)) == 0
