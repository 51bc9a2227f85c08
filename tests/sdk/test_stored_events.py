"""A call's events as the SDK reads them (toolbus._stored.call_events): stored ones by direct get,
then live ones, each once, and only those its producer published: an event without the
producer's message id, one re-aimed from another call or run, and a stored message handed out
again (a JetStream answer aimed at the subject) are dropped."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats
import pytest
from toolbus._stored import call_events
from toolbus_common.connections import ensure_stream

from tests.support.infra import unique_prefix

pytestmark = pytest.mark.integration


def event(run_id: str, call_id: str, kind: str) -> bytes:
    return json.dumps(
        {"type": kind, "callId": call_id, "runId": run_id, "at": "2026-12-07T00:00:00Z"}
    ).encode()


async def test_only_the_producers_events_are_read_each_once(nats_url: str) -> None:
    prefix = unique_prefix("tbev")
    stream = f"{prefix}_EVENTS"
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        await ensure_stream(js, stream, [f"{prefix}.events.>"], allow_direct=True)
        subject = f"{prefix}.events.calls.run_1.call_1"
        genuine = event("run_1", "call_1", "accepted")
        await js.publish(subject, genuine, headers={"Nats-Msg-Id": "call_1:1"})
        # forged: no message id; another call's id; another call's body under this call's subject
        await js.publish(subject, event("run_1", "call_1", "completed"))
        await js.publish(subject, event("run_1", "call_1", "completed"), headers={"Nats-Msg-Id": "call_2:9"})
        await js.publish(subject, event("run_9", "call_2", "completed"), headers={"Nats-Msg-Id": "call_1:5"})
        # a duplicate of the genuine one (a relay retry past the stream's dedupe window)
        await js.publish(subject, genuine, headers={"Nats-Msg-Id": "call_1:1x"})
        replayed = [s.data async for s in call_events(nc, js, stream, subject, follow=False, idle=1)]
        assert replayed == [genuine, genuine]  # the retry has another id: the stream kept it

        seen: list[bytes] = []

        async def follow() -> None:
            async for stored in call_events(nc, js, stream, subject, follow=True, idle=0.2):
                if stored.data:
                    seen.append(stored.data)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.5)
        completed = event("run_1", "call_1", "completed")
        headers: dict[str, Any] = {"Nats-Msg-Id": "call_1:2"}
        await nc.publish(subject, completed, headers={**headers, "Nats-Stream": stream, "Nats-Sequence": "1"})
        await nc.publish(subject, event("run_1", "call_1", "attemptStarted"))
        await nc.publish(subject, completed, headers=headers)
        await nc.publish(subject, completed, headers=headers)  # published twice: read once
        await nc.flush()
        for _ in range(100):
            if len(seen) >= 3:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        task.cancel()
        assert seen == [genuine, genuine, completed]
    finally:
        await js.delete_stream(stream)
        await nc.close()
