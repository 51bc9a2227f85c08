"""`raw_pub.Batch`: the bytes it hands a nats-py client are the ones `Client.publish` would queue
for the same message, and on a real server every message arrives once, in the order added, with
its reply subject and `Nats-Msg-Id` (JetStream drops a repeated id); what nats-py would refuse or
rewrite is left to `publish`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from nats.aio.msg import Msg
from nats.js.api import StreamConfig
from toolbus_common.private.raw_pub import SEND_AT_BYTES, Batch, fits

from tests.support.infra import js_name, unique_prefix, until

pytestmark = pytest.mark.integration


async def subscribe(nc: Any, subject: str, deliver: Callable[[Msg], None]) -> None:
    """A plain nats-py subscription handing each message to `deliver`, in order."""

    async def cb(msg: Msg) -> None:
        deliver(msg)

    await nc.subscribe(subject, cb=cb)


async def _queued_by_publish(nc: Any, subject: str, payload: bytes, reply: str, msg_id: str) -> bytes:
    """What `publish` appends to the client's pending list (read before the flusher runs: nothing
    in `publish` yields while connected)."""
    before = len(nc._pending)
    headers = {"Nats-Msg-Id": msg_id} if msg_id else None
    await nc.publish(subject, payload, reply=reply, headers=headers)
    data: bytes = nc._pending[before]
    return data


async def test_the_bytes_are_the_ones_publish_queues(nc: Any) -> None:
    subject = f"{unique_prefix()}.raw.same"
    for payload, reply, msg_id in [
        (b'{"type":"accepted"}', "_INBOX.abc.1", "call_1:1"),
        (b"", "_INBOX.abc.2", "call_1:2"),
        (b"x" * 3000, "", "runClosed:run_1"),
        (b"plain", "", ""),
        (b"with reply", "_INBOX.r", ""),
    ]:
        batch = Batch(nc)
        assert batch.add(subject.encode(), payload, reply=reply.encode(), msg_id=msg_id.encode())
        expected = await _queued_by_publish(nc, subject, payload, reply, msg_id)
        before = len(nc._pending)
        await batch.send()
        assert nc._pending[before] == expected
        assert len(batch) == 0
    await nc.flush()


async def test_what_publish_would_refuse_or_rewrite_is_not_added(nc: Any) -> None:
    batch = Batch(nc)
    assert not batch.add(b"", b"x")
    assert not batch.add(b"a b", b"x")
    assert not batch.add(b"a\r\nPUB x 1", b"x")
    assert not batch.add(b"ok", b"x", reply=b"in box")
    assert not batch.add(b"ok", b"x", msg_id=b" padded ")
    assert not batch.add(b"ok", b"x", msg_id=b"a\nb")
    assert not batch.add(b"ok", b"x" * (nc.max_payload + 1))
    # The server counts the header block with the payload (and closes the connection past it).
    assert not batch.add(b"ok", b"x" * (nc.max_payload - 30), msg_id=b"id-1")
    assert fits(nc, b"x" * (nc.max_payload - 31), b"id-1") and not fits(
        nc, b"x" * (nc.max_payload - 30), b"id-1"
    )
    assert fits(nc, b"x" * nc.max_payload)
    assert len(batch) == 0
    await batch.send()  # nothing to send: a no-op


async def test_messages_arrive_in_order_with_reply_and_id_and_jetstream_drops_repeats(nc: Any) -> None:
    prefix = unique_prefix()
    subject = f"{prefix}.raw.js"
    stream = js_name(prefix, "RAWPUB")
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{subject}.>"]))
    inbox = nc.new_inbox()
    acks: dict[str, bytes] = {}

    def on_ack(msg: Msg) -> None:
        acks[msg.subject] = msg.data

    await subscribe(nc, f"{inbox}.*", on_ack)
    try:
        seen: list[Msg] = []
        await subscribe(nc, f"{subject}.>", seen.append)
        await nc.flush()
        batch = Batch(nc)
        for i in range(60):
            msg_id = f"call_x:{i % 50}"  # the last ten repeat ids already sent
            assert batch.add(
                f"{subject}.c".encode(), b"%d" % i, reply=f"{inbox}.{i}".encode(), msg_id=msg_id.encode()
            )
        await batch.send()
        await until(lambda: len(acks) == 60 and len(seen) == 60, "60 messages and 60 acks")
        assert [m.data for m in seen] == [b"%d" % i for i in range(60)]
        assert [m.headers["Nats-Msg-Id"] if m.headers else None for m in seen] == [
            f"call_x:{i % 50}" for i in range(60)
        ]
        assert [m.reply for m in seen] == [f"{inbox}.{i}" for i in range(60)]
        assert all(b'"duplicate"' not in acks[f"{inbox}.{i}"] for i in range(50))
        assert all(b'"duplicate"' in acks[f"{inbox}.{i}"] for i in range(50, 60))
        info = await js.stream_info(stream)
        assert info.state.messages == 50
    finally:
        await js.delete_stream(stream)


async def test_a_batch_of_large_messages_is_full_at_a_mebibyte_and_sent_in_parts_in_order(nc: Any) -> None:
    """The relay sends a full batch before adding more (events.py), so a round of large outputs is
    never held whole in the batch; what is sent in parts arrives in the order added."""
    subject = f"{unique_prefix()}.raw.large"
    seen: list[Msg] = []
    await subscribe(nc, subject, seen.append)
    await nc.flush()
    payload = b"x" * (300 * 1024)
    batch = Batch(nc)
    sends = 0
    for i in range(10):
        assert batch.add(subject.encode(), b"%d" % i + payload)
        assert len(batch._buf) < SEND_AT_BYTES + len(payload) + 100  # never more than one over
        if batch.full:
            await batch.send()
            sends += 1
    await batch.send()
    assert sends == 2  # at 4 and at 8 messages of 300 KiB
    await until(lambda: len(seen) == 10, "10 large messages")
    assert [m.data[:1] for m in seen] == [b"%d" % i for i in range(10)]
