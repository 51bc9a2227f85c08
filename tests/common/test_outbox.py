"""The shared outbox's failure model (`toolbus_common.outbox`), on a real Redis and a real JetStream:
a message is written by the script that makes the state change; a process that dies after the change
and before any publish loses nothing (the next relay sends it); a relay that dies after publishing
and before deleting makes a duplicate that JetStream drops by message id; and the services' own
scripts (approvals, parked calls) write their messages into the one outbox layout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from nats.js.api import StreamConfig
from toolbus_approval.store import ApprovalStore
from toolbus_common.clock import now_iso
from toolbus_common.keys import Keys
from toolbus_common.outbox import LUA, OutboxRelay
from toolbus_common.script_pipe import ScriptPipe
from toolbus_contracts import Subjects
from toolbus_contracts.internal import ApprovalNeeded, CallsResume
from toolbus_credentials.parking import ParkingLot

from tests.support.infra import js_name, until

pytestmark = pytest.mark.integration

# A state change and the message that follows it, in one script: as every service writes them.
CHANGE = (
    LUA
    + """
redis.call('SET', KEYS[1], ARGV[1])
outbox_add(KEYS[2], ARGV[2], ARGV[3], ARGV[4])
"""
)


class Box:
    """One outbox, a JetStream stream of its own over `<subject>.>`, and the relays started on it."""

    def __init__(self, nc: Any, redis: Any, prefix: str, redis_url: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.nc = nc
        self.redis = redis
        self.redis_url = redis_url
        self.key = f"{prefix}:outboxtest:{tag}:outbox"
        self.state = f"{prefix}:outboxtest:{tag}:state"
        self.subject = f"{prefix}.ob{tag}"
        self.stream = js_name(prefix, f"OB{tag}")
        self.change = redis.register_script(CHANGE)
        self.relays: list[tuple[OutboxRelay, ScriptPipe, asyncio.Task[None]]] = []

    async def open(self) -> None:
        await self.nc.jetstream().add_stream(StreamConfig(name=self.stream, subjects=[f"{self.subject}.>"]))

    async def write(self, value: str) -> str:
        """The state change `value` and its message (id `change:<value>`); returns the message id."""
        msg_id = f"change:{value}"
        body = json.dumps({"value": value})
        await self.change(keys=[self.state, self.key], args=[value, f"{self.subject}.changed", msg_id, body])
        return msg_id

    def relay(self) -> OutboxRelay:
        pipe = ScriptPipe(self.redis_url)
        relay = OutboxRelay(
            self.redis, self.nc, self.key, f"t_{uuid.uuid4().hex[:8]}", lock=f"{self.key}:relay", pipe=pipe
        )
        self.relays.append((relay, pipe, asyncio.create_task(relay.run())))
        return relay

    async def pending(self) -> int:
        return int(await self.redis.xlen(self.key))

    async def stored(self) -> list[str]:
        """The values of the messages in the stream, in order."""
        js = self.nc.jetstream()
        info = await js.stream_info(self.stream)
        if not info.state.messages:
            return []
        values = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            values.append(json.loads((await js.get_msg(self.stream, seq)).data)["value"])
        return values

    async def close(self) -> None:
        for relay, pipe, task in self.relays:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await relay.release()
            await pipe.aclose()
        await self.redis.delete(self.key, self.state, f"{self.key}:relay")
        with contextlib.suppress(Exception):
            await self.nc.jetstream().delete_stream(self.stream)


@pytest_asyncio.fixture(loop_scope="session")
async def box(nc: Any, redis_client: Any, prefix: str, redis_url: str) -> AsyncIterator[Box]:
    b = Box(nc, redis_client, prefix, redis_url)
    await b.open()
    try:
        yield b
    finally:
        await b.close()


async def _drained(box: Box) -> bool:
    return await box.pending() == 0


async def test_a_change_whose_process_died_before_publishing_is_published_by_the_next_relay(box: Box) -> None:
    # The process made the changes and died: no relay ever ran. Redis holds the changes and what
    # they owe, together.
    for value in ("a", "b", "c"):
        await box.write(value)
    assert await box.redis.get(box.state) == b"c"
    assert await box.pending() == 3
    assert await box.stored() == []
    box.relay()  # the next process (or another replica)
    await until(lambda: _drained(box), "the outbox relayed")
    assert await box.stored() == ["a", "b", "c"]


async def test_a_relay_that_died_between_publish_and_delete_makes_a_duplicate_jetstream_drops(
    box: Box,
) -> None:
    msg_id = await box.write("once")
    # The dead relay's publish, as it sends it: the entry's message id as Nats-Msg-Id. It died
    # before deleting the entry, so the entry is still owed.
    (_, fields), *_ = [e for _, entries in await box.redis.xread({box.key: "0-0"}) for e in entries]
    ack = await box.nc.jetstream().publish(
        fields[b"s"].decode(), fields[b"b"], headers={"Nats-Msg-Id": fields[b"i"].decode()}
    )
    assert fields[b"i"].decode() == msg_id and not ack.duplicate
    assert await box.pending() == 1
    relay = box.relay()
    await until(lambda: _drained(box), "the outbox relayed")
    assert relay.relayed == 1  # published again, acked as a duplicate, deleted
    assert await box.stored() == ["once"]


async def test_two_relays_publishing_the_same_entries_store_each_once(box: Box) -> None:
    # A paused lock holder and its successor overlapping: both publish what they read.
    for n in range(20):
        await box.write(f"v{n}")
    entries = [e for _, es in await box.redis.xread({box.key: "0-0"}) for e in es]
    js = box.nc.jetstream()
    for _, fields in entries:  # the paused one's copies
        await js.publish(fields[b"s"].decode(), fields[b"b"], headers={"Nats-Msg-Id": fields[b"i"].decode()})
    box.relay()
    box.relay()
    await until(lambda: _drained(box), "the outbox relayed")
    assert await box.stored() == [f"v{n}" for n in range(20)]


# ---- the services write into it ----------------------------------------------------------------------


def _needed(run_id: str) -> ApprovalNeeded:
    return ApprovalNeeded(
        approval_id=f"apr_{uuid.uuid4().hex}",
        call_id=f"call_{uuid.uuid4().hex}",
        run_id=run_id,
        namespace=None,
        toolset_id="ts_" + "0" * 64,
        tool="crm.refund",
        input={"amount": 5},
        input_digest="0" * 64,
        requested_at=now_iso(),
    )


async def _entries(redis: Any, key: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(subject, message id, body) of each entry of an outbox, oldest first."""
    return [(f[b"s"].decode(), f[b"i"].decode(), json.loads(f[b"b"])) for _, f in await redis.xrange(key)]


async def test_an_approval_owes_its_announcement_and_its_decision_through_the_outbox(
    redis_client: Any, prefix: str
) -> None:
    keys, subjects = Keys(f"{prefix}:ob{uuid.uuid4().hex[:6]}"), Subjects(prefix)
    store = ApprovalStore(redis_client, keys, subjects)
    needed = _needed("run_ob")
    assert (await store.create(needed, expires_ms=None, now_ms=1)).created
    result = await store.transition(needed.approval_id, "approved", "ok", decided_at=now_iso(), now_ms=2)
    assert result.outcome == "ok"
    written = await _entries(redis_client, keys.approvals_outbox)
    # Decided before the relay sent the announcement: the decision took it back.
    assert [(s, i) for s, i, _ in written] == [
        (subjects.internal_approval_decisions, f"approval-decided-{needed.approval_id}")
    ]
    assert written[0][2]["decision"] == "approved" and written[0][2]["callId"] == needed.call_id

    other = _needed("run_ob")
    await store.create(other, expires_ms=None, now_ms=3)
    assert (await _entries(redis_client, keys.approvals_outbox))[-1][:2] == (
        subjects.approvals_requested,
        f"approval-requested-{other.approval_id}",
    )
    await redis_client.delete(keys.approvals_outbox)


async def test_unparking_calls_owes_their_resume_through_the_outbox(redis_client: Any, prefix: str) -> None:
    keys, subjects = Keys(f"{prefix}:ob{uuid.uuid4().hex[:6]}"), Subjects(prefix)
    lot = ParkingLot(redis_client, keys, subjects)
    for call in ("c1", "c2"):
        await lot.park(
            call_id=call,
            run_id="run_ob",
            server="gh",
            level="toolset",
            scope="ts",
            toolset_id="ts",
            namespace=None,
        )
    assert await lot.resume(CallsResume(call_ids=["c1", "c2"])) == ["c1", "c2"]
    assert await lot.parked_at("toolset", "ts") == []
    ((subject, msg_id, body),) = await _entries(redis_client, keys.parked_outbox)
    assert subject == subjects.internal_calls_resume and msg_id.startswith("callsResume:")
    assert body == {"callIds": ["c1", "c2"]}
    assert await lot.remove(["c1"]) == []  # a closed run's unparking owes nothing
    assert len(await _entries(redis_client, keys.parked_outbox)) == 1
    await redis_client.delete(keys.parked_outbox)
