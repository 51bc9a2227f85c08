"""Many NATS messages put on a nats-py connection as one write, without its `publish` per message.

`Client.publish` per message: a coroutine and `_send_publish`, the subject checked by a regex
(and the reply), the header block built field by field (a regex for the key, `strip` and
`translate` for the value), an f-string command, and, when the flusher was idle, a future and a
queue put to wake it. For the event relay's rounds (a message with a reply subject and one
`Nats-Msg-Id` header per event, a few dozen at a time) that is most of what relaying costs.
`Batch` writes the same bytes (`HPUB`/`PUB` exactly as nats-py's `command.py` formats them) into
one buffer and hands it to the client's pending list at once, waking the flusher once (`send`);
the flusher writes it with whatever else is pending, as for `publish`.

Only what `publish` would send unchanged goes this way: a subject, reply and id without
whitespace (nats-py refuses such subjects and rewrites such values), a payload within the
server's `max_payload`, and a connected client (while reconnecting, nats-py's own buffering and
its limit apply). `Batch.add` returns False for anything else and the caller uses `publish`
for it, after `send`-ing what it added before (so the order on the wire stays the order added).

nats-py is pinned (uv.lock); the attributes used here are the ones `Client._send_publish` and
`Client._send_command` touch (`_pending`, `_pending_data_size`, `_flush_queue`,
`_flush_pending`, `_max_payload`, `stats`); tests/common/test_raw_pub.py checks the bytes
against nats-py's and runs it on a real server.
"""

from __future__ import annotations

import re

from nats.aio.client import Client as NatsClient

_UNSAFE = re.compile(rb"[ \t\r\n]")
"""What nats-py refuses in a subject (`_SUBJECT_INVALID_RE`) and trims or replaces in a header
value: a token with any of it is not sent raw."""


SEND_AT_BYTES = 1024 * 1024
"""A batch this large is sent before more is added (`Batch.full`): a round of 512 entries with
outputs near `max_payload` would otherwise be held whole here, and copied once more by `send`,
before nats-py's own limit on what waits to be written (`pending_size`, 2 MiB) could apply."""


_HEADER_ROOM = len(b"NATS/1.0\r\nNats-Msg-Id: \r\n\r\n")
_SIGNATURE_ROOM = len(b"Toolbus-Signature: \r\n")


def fits(nc: NatsClient, payload: bytes, msg_id: bytes = b"", signature: bytes = b"") -> bool:
    """Whether a message fits in the server's `max_payload` with its `Nats-Msg-Id` (and
    `Toolbus-Signature`) header: the server counts the header block with the payload and closes a
    connection that sends more, while nats-py's `publish` checks the payload alone."""
    headers = len(msg_id) + _HEADER_ROOM if msg_id else 0
    if signature:
        headers += len(signature) + _SIGNATURE_ROOM
    return len(payload) + headers <= nc._max_payload


class Batch:
    """Messages for one write on `nc`: `add` each, then `await send()`."""

    __slots__ = ("_buf", "_msgs", "_nc", "_payload")

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self._buf = bytearray()
        self._msgs = 0
        self._payload = 0

    def add(
        self,
        subject: bytes,
        payload: bytes,
        *,
        reply: bytes = b"",
        msg_id: bytes = b"",
        signature: bytes = b"",
    ) -> bool:
        """Add one message (with a `Nats-Msg-Id` header when `msg_id`, and a `Toolbus-Signature`
        one when `signature`: only with a `msg_id`); False, and nothing added, when it must go
        through `publish` instead (see the module)."""
        nc = self._nc
        if (
            not subject
            or _UNSAFE.search(subject)
            or (reply and _UNSAFE.search(reply))
            or (msg_id and _UNSAFE.search(msg_id))
            or (signature and not msg_id)
            or not fits(nc, payload, msg_id, signature)
            or not nc.is_connected
            or nc.is_draining_pubs
        ):
            return False
        if signature:
            hdr = b"NATS/1.0\r\nNats-Msg-Id: %b\r\nToolbus-Signature: %b\r\n\r\n" % (msg_id, signature)
            self._buf += b"HPUB %b %b %d %d\r\n%b%b\r\n" % (
                subject, reply, len(hdr), len(hdr) + len(payload), hdr, payload,
            )  # fmt: skip
        elif msg_id:
            hdr = b"NATS/1.0\r\nNats-Msg-Id: %b\r\n\r\n" % msg_id
            self._buf += b"HPUB %b %b %d %d\r\n%b%b\r\n" % (
                subject, reply, len(hdr), len(hdr) + len(payload), hdr, payload,
            )  # fmt: skip
        else:
            self._buf += b"PUB %b %b %d\r\n%b\r\n" % (subject, reply, len(payload), payload)
        self._msgs += 1
        self._payload += len(payload)
        return True

    def __len__(self) -> int:
        return self._msgs

    @property
    def full(self) -> bool:
        """Holding `SEND_AT_BYTES` or more: `send` before adding more, so that a round of large
        events is handed over (and written) a part at a time, not held whole in this buffer."""
        return len(self._buf) >= SEND_AT_BYTES

    async def send(self) -> None:
        """Hand what was added to the client (one pending entry) and wake its flusher if idle,
        as `publish` does; the batch is empty again after."""
        if not self._msgs:
            return
        nc = self._nc
        data = bytes(self._buf)
        self._buf.clear()
        nc.stats["out_msgs"] += self._msgs
        nc.stats["out_bytes"] += self._payload
        self._msgs = self._payload = 0
        nc._pending.append(data)
        nc._pending_data_size += len(data)
        if nc._max_pending_size > 0 and nc._pending_data_size > nc._max_pending_size:
            await nc._flush_pending(force_flush=True)  # as `_send_command`: wait for the write
        elif nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()
