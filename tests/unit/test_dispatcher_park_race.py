"""A call being parked for credentials must not be cancelled by a lease renewal that already sees
it parked (found by the fault suite: a call stayed parked forever with no CallParked sent)."""

from __future__ import annotations

import asyncio
from typing import Any

from toolbus_contracts import Subjects
from toolbus_dispatcher.calls import CallRunner
from toolbus_dispatcher.executors.base import NeedsCredentials
from toolbus_dispatcher.records import CallRecord
from toolbus_dispatcher.store import Finished


class SlowReplyStore:
    """The park script runs at once (the call is parked, its lease gone), its reply comes late."""

    lease = 3.0

    def __init__(self) -> None:
        self.state = "running"
        self.parked = asyncio.Event()
        self.reply = asyncio.Event()

    async def park(self, call_id: str, server: str, level: str, now: str) -> Finished:
        self.state = "parked"
        self.parked.set()
        await self.reply.wait()
        return Finished("parked", [], [])

    async def renew(self, call_ids: list[str]) -> list[str]:
        return [c for c in call_ids if self.state != "running"]


class Recorder:
    def __init__(self) -> None:
        self.published: list[str] = []

    async def publish(self, subject: str, body: bytes, **_: Any) -> None:
        self.published.append(subject)


async def test_a_renewal_during_a_park_does_not_cancel_its_announcement() -> None:
    store, js, subjects = SlowReplyStore(), Recorder(), Subjects("t")
    runner = CallRunner(
        store=store,  # type: ignore[arg-type]
        toolsets=None,  # type: ignore[arg-type]
        executors={},
        outputs=None,  # type: ignore[arg-type]
        nc=None,  # type: ignore[arg-type]
        js=js,  # type: ignore[arg-type]
        subjects=subjects,
        retry_backoff=0.01,
        retry_backoff_max=0.01,
    )
    rec = CallRecord("call_1", "run_1", "c.ok", "{}", "key-1", "ts_1", None, "retry", 1, "running")
    runner._leased.add(rec.call_id)
    task = asyncio.create_task(runner._park(rec, NeedsCredentials("c", "toolset", 3)))
    runner._tasks[rec.call_id] = task
    await store.parked.wait()
    await runner.renew_leases()  # the call is no longer running: reported lost
    store.reply.set()
    await asyncio.wait_for(task, 5)
    assert js.published == [subjects.internal_calls_park]
