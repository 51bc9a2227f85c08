"""A call being parked for credentials must not be cancelled by a lease renewal that already sees
it parked (found by the fault suite: a call stayed parked forever with no CallParked sent; the
command now goes into the outbox in the park script, and the calls the park admitted must still
be started)."""

from __future__ import annotations

import asyncio

from toolbus_contracts import Subjects
from toolbus_contracts.internal import CallParked
from toolbus_dispatcher.calls import CallRunner
from toolbus_dispatcher.executors.base import NeedsCredentials
from toolbus_dispatcher.records import CallRecord
from toolbus_dispatcher.store import Finished

NEXT = CallRecord("call_2", "run_1", "r.ok", "{}", "key-2", "ts_1", None, "retry", 1, "running")


class SlowReplyStore:
    """The park script runs at once (the call is parked, its lease gone), its reply comes late."""

    lease = 3.0

    def __init__(self) -> None:
        self.state = "running"
        self.parked = asyncio.Event()
        self.reply = asyncio.Event()

    async def park(
        self, call_id: str, server: str, level: str, now: str, *, announce: tuple[str, bytes]
    ) -> Finished:
        self.state = "parked"
        self.announced = announce
        self.parked.set()
        await self.reply.wait()
        return Finished("parked", [], [NEXT])

    async def renew(self, call_ids: list[str]) -> list[str]:
        return [c for c in call_ids if self.state != "running"]


async def test_a_renewal_during_a_park_does_not_cancel_it() -> None:
    store, subjects = SlowReplyStore(), Subjects("t")
    runner = CallRunner(
        store=store,  # type: ignore[arg-type]
        toolsets=None,  # type: ignore[arg-type]
        executors={},
        outputs=None,  # type: ignore[arg-type]
        publish_reply=None,  # type: ignore[arg-type]
        subjects=subjects,
        retry_backoff=0.01,
        retry_backoff_max=0.01,
    )
    rec = CallRecord("call_1", "run_1", "c.ok", "{}", "key-1", "ts_1", None, "retry", 1, "running")
    runner._leased.add(rec.call_id)
    task = asyncio.create_task(runner._park(rec, NeedsCredentials("c", "toolset", 3)))
    runner._tasks[rec.call_id] = task
    started: list[str] = []

    def start(records: list[CallRecord], reaped: bool = False) -> None:
        started.extend(r.call_id for r in records)

    runner.start = start  # type: ignore[method-assign]
    await store.parked.wait()
    await runner.renew_leases()  # the call is no longer running: reported lost
    store.reply.set()
    await asyncio.wait_for(task, 5)
    assert started == ["call_2"]  # the call the park admitted runs
    subject, body = store.announced  # the CallParked command, written by the park script
    assert subject == subjects.internal_calls_park
    assert CallParked.model_validate_json(body).credentials_version == 3
