"""The serving layer against a real NATS with JetStream (`toolbus_common.bus`).

Proves: a request gets exactly one reply even when the reply cannot be sent as built (too large,
not serializable, publish failed) on both the FastStream path and the raw hot path; internal
commands are durable (sent while no consumer runs, applied once when it starts), shared by
replicas (each applied exactly once), and a body that does not parse is dead-lettered (kept with
its reason, not redelivered) while the consumer goes on; a backing-store fault is retried and a
handler that keeps failing is dead-lettered after `MAX_DELIVERIES`.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import nats.errors
import pytest
import pytest_asyncio
import redis.exceptions
from pydantic import SecretStr
from toolbus_common.bus import MAX_DELIVERIES, Bus, Routes
from toolbus_common.connections import ensure_stream
from toolbus_common.settings import Settings
from toolbus_contracts import Subjects, WireModel

from tests.support.commands import TEST_SECRET_KEY, publish_command
from tests.support.infra import js_name, request, unique_prefix, until

pytestmark = pytest.mark.integration


class Ping(WireModel):
    size: int = 0
    mode: str = "ok"


class Pong(WireModel):
    text: str


class Note(WireModel):
    id: str
    fail: str = ""


class Sink:
    """What the test handlers do: answer pings, record applied notes, fail on demand."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.attempts: Counter[str] = Counter()


def ping_routes(fast: bool) -> Routes[Sink]:
    routes: Routes[Sink] = Routes("bustest")

    @routes.request(lambda s: s._s("bus.ping.fast" if fast else "bus.ping"), fast=fast)
    async def handle_ping(sink: Sink, ping: Ping) -> Pong | dict[str, Any]:
        if ping.mode == "unserializable":
            return {"value": object()}
        return Pong(text="x" * ping.size)

    return routes


def note_routes() -> Routes[Sink]:
    routes: Routes[Sink] = Routes("bustest")

    @routes.command(lambda s: s._s("internal.bus.notes"), durable="bustest-notes")
    async def handle_note(sink: Sink, note: Note) -> None:
        sink.attempts[note.id] += 1
        if note.fail == "store" and sink.attempts[note.id] == 1:
            raise redis.exceptions.ConnectionError("redis went away")
        if note.fail == "bug":
            raise RuntimeError("a bug")
        if note.fail == "slow":
            await asyncio.sleep(3.5)
        sink.applied.append(note.id)

    return routes


@pytest_asyncio.fixture(loop_scope="session")
async def env(nats_url: str) -> AsyncIterator[tuple[Settings, Any]]:
    prefix = unique_prefix("tbbus")
    settings = Settings(nats_url=nats_url, subject_prefix=prefix, secret_key=SecretStr(TEST_SECRET_KEY))
    client = await nats.connect(nats_url)
    js = client.jetstream()
    await ensure_stream(js, js_name(prefix, "INTERNAL"), [Subjects(prefix).internal_all])
    try:
        yield settings, client
    finally:
        await js.delete_stream(js_name(prefix, "INTERNAL"))
        await client.close()


async def started(
    settings: Settings, *tables: Routes[Sink], sink: Sink | None = None, ack_wait: float = 10.0
) -> tuple[Bus, Sink]:
    sink = sink or Sink()
    bus = Bus(settings, name="bustest", queue="toolbus-bustest", retry_delay=0.05, ack_wait=ack_wait)
    await bus.connect()
    for table in tables:
        bus.include(table, sink)
    await bus.start()
    return bus, sink


async def stopped(bus: Bus) -> None:
    await bus.drain(2)
    await bus.close()


@pytest.mark.parametrize("fast", [False, True], ids=["faststream", "raw"])
async def test_a_reply_too_large_for_a_message_is_answered_output_too_large(
    env: tuple[Settings, Any], fast: bool
) -> None:
    settings, client = env
    bus, _ = await started(settings, ping_routes(fast))
    subject = settings.subjects._s("bus.ping.fast" if fast else "bus.ping")
    try:
        small = await request(client, subject, {"size": 10})
        assert small == {"ok": True, "data": {"text": "x" * 10}}
        big = await request(client, subject, {"size": client.max_payload + 10})
        assert big["ok"] is False
        assert big["error"]["code"] == "outputTooLarge"
        assert big["error"]["details"]["maxPayload"] == client.max_payload
        assert big["error"]["details"]["size"] > client.max_payload
    finally:
        await stopped(bus)


@pytest.mark.parametrize("fast", [False, True], ids=["faststream", "raw"])
async def test_a_reply_that_cannot_be_encoded_is_internal_and_bad_input_names_the_field(
    env: tuple[Settings, Any], fast: bool
) -> None:
    settings, client = env
    bus, _ = await started(settings, ping_routes(fast))
    subject = settings.subjects._s("bus.ping.fast" if fast else "bus.ping")
    try:
        broken = await request(client, subject, {"mode": "unserializable"})
        assert broken["ok"] is False and broken["error"]["code"] == "internal"
        bad = await request(client, subject, {"size": "5"})
        assert bad["error"]["code"] == "invalidRequest" and bad["error"]["details"] == {"field": "size"}
    finally:
        await stopped(bus)


async def test_a_failed_reply_publish_on_the_raw_path_becomes_unavailable(env: tuple[Settings, Any]) -> None:
    settings, client = env
    bus, _ = await started(settings, ping_routes(True))
    real_publish = bus.nc.publish
    failures = 0

    async def publish_failing_once(subject: str, payload: bytes = b"", *args: Any, **kw: Any) -> None:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise nats.errors.OutboundBufferLimitError
        await real_publish(subject, payload, *args, **kw)

    bus.nc.publish = publish_failing_once  # type: ignore[method-assign]
    try:
        reply = await request(client, settings.subjects._s("bus.ping.fast"), {"size": 3})
        assert failures == 1
        assert reply["ok"] is False and reply["error"]["code"] == "unavailable"
        assert reply["error"]["details"] == {"store": "NATS"}
    finally:
        bus.nc.publish = real_publish  # type: ignore[method-assign]
        await stopped(bus)


async def _publish_notes(client: Any, settings: Settings, ids: list[str], **extra: str) -> None:
    js = client.jetstream()
    for note_id in ids:
        await publish_command(
            js, settings.subjects._s("internal.bus.notes"), json.dumps({"id": note_id, **extra}).encode()
        )


async def test_a_command_sent_while_no_consumer_runs_is_applied_once_when_it_starts(
    env: tuple[Settings, Any],
) -> None:
    settings, client = env
    first, sink = await started(settings, note_routes())
    await _publish_notes(client, settings, ["before"])
    await until(lambda: sink.applied == ["before"], "the first command")
    await stopped(first)

    await _publish_notes(client, settings, ["while-down-1", "while-down-2"])  # nobody consumes now
    again, sink = await started(settings, note_routes(), sink=sink)
    try:
        await until(lambda: len(sink.applied) == 3, "the commands sent while it was down")
        assert sink.applied == ["before", "while-down-1", "while-down-2"]
    finally:
        await stopped(again)


async def test_two_replicas_share_the_durable_consumer_and_apply_each_command_once(
    env: tuple[Settings, Any],
) -> None:
    settings, client = env
    shared = Sink()
    one, _ = await started(settings, note_routes(), sink=shared)
    two, _ = await started(settings, note_routes(), sink=shared)
    ids = [f"n{i}" for i in range(60)]
    try:
        await _publish_notes(client, settings, ids)
        await until(lambda: len(shared.applied) >= len(ids), "every command applied")
        await asyncio.sleep(0.3)  # a duplicate would show up now (not a timing assertion)
        assert sorted(shared.applied) == sorted(ids)
        assert all(count == 1 for count in shared.attempts.values())
    finally:
        await stopped(one)
        await stopped(two)


async def test_a_handler_running_past_ack_wait_keeps_its_command(env: tuple[Settings, Any]) -> None:
    settings, client = env
    bus, sink = await started(settings, note_routes(), ack_wait=1.5)
    try:
        await _publish_notes(client, settings, ["slow"], fail="slow")  # 3.5 s: past two ack waits
        await until(lambda: sink.applied == ["slow"], "the slow command")
        await asyncio.sleep(2.0)  # a redelivery would show up now (not a timing assertion)
        assert sink.attempts["slow"] == 1
    finally:
        await stopped(bus)


async def test_a_command_held_by_a_replica_that_died_goes_to_another_within_ack_wait(
    env: tuple[Settings, Any], nats_url: str
) -> None:
    settings, client = env
    first, _ = await started(settings, note_routes(), ack_wait=1.0)  # makes the durable consumer
    await stopped(first)
    await _publish_notes(client, settings, ["orphan"])
    # A replica that took the command and died (kill -9): delivered to it, never acked.
    dying = await nats.connect(nats_url)
    taken = await dying.jetstream().pull_subscribe_bind(
        "bustest-notes", stream=js_name(settings.subject_prefix, "INTERNAL")
    )
    assert len(await taken.fetch(1, timeout=5)) == 1
    await dying.close()
    other, sink = await started(settings, note_routes(), ack_wait=1.0)
    try:
        # Delivered again once its ack wait is over (1 s here; 10 s by default, it was 30 s).
        await until(lambda: sink.applied == ["orphan"], "the command on the other replica", limit=8)
    finally:
        await stopped(other)


async def dead_letters(client: Any, settings: Settings, count: int) -> list[Any]:
    """The first `count` messages kept on the test subject's dead-letter subject (INTERNAL stream)."""
    dead = await client.jetstream().subscribe(
        settings.subjects._s("internal.deadletter.bus.notes"),
        stream=js_name(settings.subject_prefix, "INTERNAL"),
        ordered_consumer=True,
    )
    try:
        return [await dead.next_msg(timeout=20) for _ in range(count)]
    finally:
        await dead.unsubscribe()


async def test_an_unparseable_command_is_dead_lettered_and_the_consumer_goes_on(
    env: tuple[Settings, Any],
) -> None:
    settings, client = env
    bus, sink = await started(settings, note_routes())
    js = client.jetstream()
    subject = settings.subjects._s("internal.bus.notes")
    try:
        await publish_command(js, subject, b'{"id": 7, "oops": true}')
        await publish_command(js, subject, b"not json at all")
        await _publish_notes(client, settings, ["after"])
        await until(lambda: sink.applied == ["after"], "the valid command after the bad ones")

        kept = await dead_letters(client, settings, 2)
        assert [m.data for m in kept] == [b'{"id": 7, "oops": true}', b"not json at all"]
        for m in kept:
            assert m.headers is not None
            assert m.headers["Toolbus-Dead-Subject"] == subject
            assert m.headers["Toolbus-Dead-Consumer"] == "bustest-notes"
            assert m.headers["Toolbus-Dead-Reason"].startswith("Note: ")
        assert "'oops'" in kept[0].headers["Toolbus-Dead-Reason"]

        info = await js.consumer_info(js_name(settings.subject_prefix, "INTERNAL"), "bustest-notes")
        assert info.num_pending == 0 and info.num_ack_pending == 0  # terminated: never redelivered
    finally:
        await stopped(bus)


async def test_store_faults_are_retried_and_a_handler_that_keeps_failing_is_dead_lettered(
    env: tuple[Settings, Any],
) -> None:
    settings, client = env
    bus, sink = await started(settings, note_routes())
    try:
        await _publish_notes(client, settings, ["flaky"], fail="store")
        await _publish_notes(client, settings, ["broken"], fail="bug")
        await until(lambda: sink.applied == ["flaky"], "the command after a store fault", limit=20)
        assert sink.attempts["flaky"] == 2
        (kept,) = await dead_letters(client, settings, 1)
        assert json.loads(kept.data) == {"id": "broken", "fail": "bug"}
        assert kept.headers is not None
        assert kept.headers["Toolbus-Dead-Reason"] == f"failed {MAX_DELIVERIES} times: RuntimeError"
        assert sink.attempts["broken"] == MAX_DELIVERIES
    finally:
        await stopped(bus)


async def test_each_running_service_serves_its_asyncapi_document(service_env: dict[str, str]) -> None:
    import urllib.request

    import yaml

    from tests.support.infra import aservice_process

    def fetch(url: str) -> bytes:
        with urllib.request.urlopen(url, timeout=10) as response:
            body: bytes = response.read()
            return body

    prefix = service_env["TOOLBUS_SUBJECT_PREFIX"]
    expected = {
        "registry": "toolsets.create",
        "dispatcher": "calls.invoke",
        "approval": "approvals.decide",
        "credentials": "runs.credentials.set",
    }
    for name, subject in expected.items():
        async with aservice_process(name, service_env) as svc:
            doc = json.loads(await asyncio.to_thread(fetch, f"{svc.base_url}/asyncapi"))
            assert yaml.safe_load(await asyncio.to_thread(fetch, f"{svc.base_url}/asyncapi.yaml")) == doc
        assert doc["asyncapi"] == "3.0.0"
        assert doc["channels"][subject]["address"] == f"{prefix}.{subject}"
        assert "reply" in doc["operations"][subject]


def noting_routes(fast: bool) -> Routes[Sink]:
    routes: Routes[Sink] = Routes("bustest")

    @routes.request(lambda s: s._s("bus.note.fast" if fast else "bus.note"), fast=fast)
    async def handle_note_request(sink: Sink, note: Note) -> Pong:
        sink.applied.append(note.id)
        return Pong(text=note.id)

    return routes


@pytest.mark.parametrize("fast", [False, True], ids=["faststream", "raw"])
async def test_a_consumers_deliveries_aimed_at_a_request_subject_are_dropped(
    env: tuple[Settings, Any], fast: bool
) -> None:
    """Anyone allowed to read a stream can have its messages sent to any subject and queue group:
    a consumer's deliveries (nats-server checks no deliver subject against the creator's
    permissions) and a direct get's answer (nor a request's reply subject), and a stream's
    messages can be a caller's own bytes (a tool output stored by reference): such a message is
    no request, and is dropped unread; a request on the subject is still served."""
    from nats.js.api import AckPolicy, ConsumerConfig

    settings, client = env
    js = client.jetstream()
    prefix = settings.subject_prefix
    stream = js_name(prefix, "STORED")
    await js.add_stream(name=stream, subjects=[f"{prefix}.stored.>"], allow_direct=True)
    bus, sink = await started(settings, noting_routes(fast))
    subject = settings.subjects._s("bus.note.fast" if fast else "bus.note")
    acks: list[str] = []

    async def on_ack(msg: Any) -> None:
        acks.append(msg.subject)

    acked = await client.subscribe("$JS.ACK.>", cb=on_ack)
    try:
        await js.publish(f"{prefix}.stored.x", json.dumps({"id": "forged"}).encode())
        await js.add_consumer(
            stream,
            config=ConsumerConfig(
                deliver_subject=subject, deliver_group="toolbus-bustest", ack_policy=AckPolicy.NONE
            ),
        )
        # A direct get's answer goes to whatever reply subject the request named: the same bytes.
        await client.publish(f"$JS.API.DIRECT.GET.{stream}", b'{"seq": 1}', reply=subject)
        info = await js.stream_info(stream)
        await asyncio.sleep(1.0)  # delivered at once, if it were taken
        assert info.state.messages == 1 and sink.applied == []
        # Nothing answered either: an empty reply to the $JS.ACK. subject is refused under the
        # secured configuration (a permissions warning each time in the service's log).
        assert [a for a in acks if f".{stream}." in a] == []
        assert await request(client, subject, {"id": "real"}) == {"ok": True, "data": {"text": "real"}}
        assert sink.applied == ["real"]
    finally:
        await acked.unsubscribe()
        await stopped(bus)
        await js.delete_stream(stream)
