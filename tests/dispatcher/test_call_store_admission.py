"""`create_call` and `finish_call` on a real Redis (`CallStore` alone, no dispatcher): a call that
finds its run's slots free is admitted at once (the script's short path) and leaves the same call
hash, slots and outbox events as one queued and then admitted (the long path: a call waiting
behind a tool's concurrency limit, admitted when the call before it finishes). Each call's events
are numbered 1, 2, 3, ... in the outbox, as `docs/protocol.md` promises."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common.keys import Keys
from toolbus_common.script_pipe import ScriptPipe
from toolbus_contracts.registry import RUN_CONCURRENCY
from toolbus_dispatcher.store import CallStore, Created

from tests.support.infra import drop_redis_keys, unique_prefix

pytestmark = pytest.mark.integration

NOW = "2026-12-01T18:00:00.000Z"
OWNER = "d_test"


@pytest_asyncio.fixture(loop_scope="session")
async def store(redis_client: Any, redis_url: str) -> AsyncIterator[CallStore]:
    prefix = unique_prefix("tbs")
    pipe = ScriptPipe(redis_url)
    s = CallStore(
        redis_client,
        Keys(prefix),
        OWNER,
        lease=30.0,
        pipe=pipe,
        events_prefix=f"{prefix}.events.calls.",
        runs_closed_subject=f"{prefix}.internal.runs.closed",
    )
    await s.load_scripts()
    try:
        yield s
    finally:
        await pipe.aclose()
        await drop_redis_keys(redis_url, prefix)


async def _run(store: CallStore) -> str:
    run_id = f"run_{uuid.uuid4().hex[:12]}"
    assert await store.open_run(run_id, "ts1", None, NOW) == "opened"
    return run_id


async def _create(store: CallStore, run_id: str, tool: str = "t", concurrency: int | None = None) -> Created:
    call_id = f"call_{uuid.uuid4().hex[:12]}"
    return await store.create_call(
        call_id=call_id,
        run_id=run_id,
        idempotency_key=call_id,
        tool=tool,
        input_json='{"a":1}',
        toolset_id="ts1",
        namespace=None,
        concurrency=concurrency,
        on_interruption="retry",
        reply=f"_INBOX.{call_id}",
        now=NOW,
        approval_id="",
        digest="d",
    )


async def _events(store: CallStore, call_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(message id, subject, body) of the call's entries in the outbox, oldest first."""
    out = []
    for _, fields in await store._r.xrange(store.outbox):
        if fields[b"i"].decode().startswith(f"{call_id}:"):
            out.append((fields[b"i"].decode(), fields[b"s"].decode(), json.loads(fields[b"b"])))
    return out


async def _hash(store: CallStore, call_id: str) -> dict[str, str]:
    raw = await store._r.hgetall(store.keys.call(call_id))
    return {k.decode(): v.decode() for k, v in raw.items()}


# Fields whose values differ between two calls of one run and one tool, whichever path admitted
# them (the slot, queue and run keys are the same for both, and compared).
PER_CALL = {"key", "handed"}


async def test_a_call_with_free_slots_is_admitted_as_a_queued_one_would_be(store: CallStore) -> None:
    run_id = await _run(store)
    first = await _create(store, run_id, tool="slow", concurrency=1)  # free slots: the short path
    assert first.status == "created" and first.state == "running"
    assert [(c.call_id, c.attempts) for c in first.admitted] == [(first.call_id, 1)]
    # Who the create admitted, for a retry after a lost reply: the call itself.
    a = await _hash(store, first.call_id)  # as the short path left it
    assert a["handed"] == first.call_id
    second = await _create(store, run_id, tool="slow", concurrency=1)  # the tool's one slot is taken
    assert second.state == "waitingSlot" and second.admitted == []

    done = await store.finish(first.call_id, '{"status":"ok"}', NOW)
    assert done.status == "done" and done.replies == [f"_INBOX.{first.call_id}"]
    assert [(c.call_id, c.attempts, c.state) for c in done.admitted] == [(second.call_id, 1, "running")]

    # The long path's end state is the short path's: the same fields, the same values (but those
    # naming the call itself), and (below) the same three events numbered 1, 2, 3.
    b = await _hash(store, second.call_id)
    assert a["state"] == b["state"] == "running" and a["evseq"] == b["evseq"] == "2"
    assert set(b) == set(a) - {"handed"}  # the finish that admitted it notes it as handed
    assert {k: v for k, v in b.items() if k not in PER_CALL} == {
        k: v for k, v in a.items() if k not in PER_CALL
    }
    assert (await _hash(store, first.call_id))["handed"] == second.call_id
    await store.finish(second.call_id, '{"status":"ok"}', NOW)
    for call_id in (first.call_id, second.call_id):
        events = await _events(store, call_id)
        assert [(i, body["type"]) for i, _, body in events] == [
            (f"{call_id}:1", "accepted"),
            (f"{call_id}:2", "attemptStarted"),
            (f"{call_id}:3", "completed"),
        ]
        assert {s for _, s, _ in events} == {f"{store.events_prefix}{run_id}.{call_id}"}
        assert events[1][2]["attempt"] == 1 and events[2][2]["outcome"] == {"status": "ok"}
    k = store.keys
    assert await store._r.zcard(k.run_slots(run_id)) == 0
    assert await store._r.zcard(k.run_tool_slots(run_id, "slow")) == 0
    assert await store._r.zcard(k.run_waiting(run_id)) == 0
    assert await store._r.zscore(k.call_leases, first.call_id) is None


async def test_a_repeated_create_hands_the_short_path_call_back(store: CallStore) -> None:
    run_id = await _run(store)
    first = await _create(store, run_id)
    again = await store.create_call(
        call_id="call_other",
        run_id=run_id,
        idempotency_key=first.call_id,  # the same key: a retry after a lost reply
        tool="t",
        input_json='{"a":1}',
        toolset_id="ts1",
        namespace=None,
        concurrency=None,
        on_interruption="retry",
        reply="_INBOX.again",
        now=NOW,
        approval_id="",
        digest="d",
    )
    assert again.status == "exists" and again.call_id == first.call_id and again.state == "running"
    assert [c.call_id for c in again.admitted] == [first.call_id]


async def test_the_run_limit_queues_the_call_after_it(store: CallStore) -> None:
    run_id = await _run(store)
    running = [await _create(store, run_id) for _ in range(RUN_CONCURRENCY)]
    assert all(c.state == "running" for c in running)
    queued = await _create(store, run_id)
    assert queued.state == "waitingSlot"
    done = await store.finish(running[0].call_id, '{"status":"ok"}', NOW)
    assert [c.call_id for c in done.admitted] == [queued.call_id]
    assert (await _create(store, run_id)).state == "waitingSlot"


async def test_a_call_behind_one_held_by_its_tool_limit_still_runs(store: CallStore) -> None:
    # Someone waits (the long path), but only for its tool's slot: a call of another tool is
    # admitted past it, as before.
    run_id = await _run(store)
    await _create(store, run_id, tool="slow", concurrency=1)
    held = await _create(store, run_id, tool="slow", concurrency=1)
    other = await _create(store, run_id, tool="fast")
    assert held.state == "waitingSlot" and other.state == "running"
    assert [(c.call_id, c.attempts) for c in other.admitted] == [(other.call_id, 1)]
    assert [i for i, _, _ in await _events(store, other.call_id)] == [
        f"{other.call_id}:1",
        f"{other.call_id}:2",
    ]


async def test_leases_run_on_redis_clock_not_the_dispatchers(
    store: CallStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dispatcher's clock an hour behind or ahead changes no lease: leases are written (by the
    short path and by `admit`), renewed and judged expired by Redis's `TIME` inside the scripts.
    (With the dispatcher's clock, a call leased by one an hour behind was expired at once, and one
    an hour ahead reaped live calls.)"""
    real = time.time
    k = store.keys

    async def redis_now() -> float:
        secs, micros = await store._r.time()
        return float(secs + micros / 1e6)

    async def leased(call_id: str, before: float) -> float:
        """The call's lease, checked to be Redis's clock (between `before` and now) + 30 s."""
        score = await store._r.zscore(k.call_leases, call_id)
        assert score is not None and before + 30 <= score <= await redis_now() + 30, (score, before)
        return float(score)

    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    run_id = await _run(store)
    t0 = await redis_now()
    first = await _create(store, run_id, tool="slow", concurrency=1)  # the short path
    await leased(first.call_id, t0)
    second = await _create(store, run_id, tool="slow", concurrency=1)  # waits for the tool's slot
    assert second.state == "waitingSlot"
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    assert await store.reap() == []  # still leased, by Redis's clock
    t1 = await redis_now()
    assert await store.renew([first.call_id]) == []  # still ours
    await leased(first.call_id, t1)
    t2 = await redis_now()
    done = await store.finish(first.call_id, '{"status":"ok"}', NOW)  # admits the second
    assert [c.call_id for c in done.admitted] == [second.call_id]
    await leased(second.call_id, t2)
    assert await store.reap() == []
    assert (await store.finish(second.call_id, '{"status":"ok"}', NOW)).status == "done"
