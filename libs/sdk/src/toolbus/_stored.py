"""What the services stored, read by a client with JetStream direct gets only: a call's events
and outputs stored by reference. A direct get is the one JetStream request a client's NATS
account imports (deploy/nats/README.md): it creates nothing on the server, and its answer can
only come back to the client."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import ObjectInfo, RawStreamMsg
from nats.js.errors import NotFoundError

log = logging.getLogger("toolbus")

STORED_HEADERS = ("Nats-Stream", "Nats-Sequence")
"""Headers of a message JetStream handed out: an event that comes with them on a live
subscription is a stored message someone aimed there, not one its producer published."""


@dataclass(frozen=True)
class Stored:
    """One event message: its body and the message id its producer gave it."""

    data: bytes
    msg_id: str


def event_producer_id(subject: str, data: bytes, headers: dict[str, str] | None) -> str | None:
    """The message id of an event its producer published on `subject` (`events.calls.<runId>.
    <callId>`), or None for anything else: an event without its producer's id (`<callId>:<n>`),
    one whose run or call is not its subject's, or a stored message handed out again."""
    msg_id = (headers or {}).get("Nats-Msg-Id")
    if not msg_id:
        return None
    tokens = subject.split(".")
    if len(tokens) < 2:
        return None
    run_id, call_id = tokens[-2], tokens[-1]
    if msg_id.partition(":")[0] != call_id:
        return None
    try:
        body = json.loads(data)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("callId") != call_id or body.get("runId") != run_id:
        return None
    return msg_id


def _dropped(subject: str) -> None:
    log.warning("dropped an event its producer did not publish", extra={"subject": subject})


async def replay(
    js: JetStreamContext, stream: str, subject: str
) -> AsyncGenerator[tuple[str, RawStreamMsg], None]:
    """Every message stored on `subject` (wildcards allowed), oldest first: (its subject, the
    direct get's answer)."""
    seq = 1
    while True:
        try:
            raw = await js.get_msg(stream, seq=seq, subject=subject, direct=True, next=True)
        except NotFoundError:
            return
        yield str(raw.subject), raw
        seq = int(raw.seq or seq) + 1


async def call_events(
    nc: NatsClient, js: JetStreamContext, stream: str, subject: str, *, follow: bool, idle: float
) -> AsyncGenerator[Stored, None]:
    """A call's events: those stored, then (with `follow`) those published from now on, each once
    (by its producer's message id) and only those its producer published (`event_producer_id`).
    Without `follow` it ends after the last stored event; with it, `idle` seconds without an event
    yields nothing but lets the caller look around (it ends when the caller stops iterating)."""
    live = await nc.subscribe(subject) if follow else None
    seen: set[str] = set()
    try:
        async for stored_subject, raw in replay(js, stream, subject):
            headers = {k: v for k, v in (raw.headers or {}).items() if k not in STORED_HEADERS}
            msg_id = event_producer_id(stored_subject, raw.data or b"", headers)
            if msg_id is None:
                _dropped(stored_subject)
                continue
            if msg_id in seen:
                continue
            seen.add(msg_id)
            yield Stored(raw.data or b"", msg_id)
        if live is None:
            return
        while True:
            try:
                msg = await live.next_msg(timeout=idle)
            except TimeoutError:
                yield Stored(b"", "")
                continue
            headers = msg.headers or {}
            if any(h in headers for h in STORED_HEADERS):
                _dropped(msg.subject)
                continue
            msg_id = event_producer_id(msg.subject, msg.data, headers)
            if msg_id is None:
                _dropped(msg.subject)
                continue
            if msg_id in seen:
                continue
            seen.add(msg_id)
            yield Stored(msg.data, msg_id)
    finally:
        if live is not None:
            with contextlib.suppress(Exception):  # the connection is gone: so is the subscription
                await live.unsubscribe()


class StoredObjectMissing(Exception):
    """The object (or its bucket) is not in the object store."""


class StoredObjectCorrupt(Exception):
    """The object's chunks do not add up to its size and digest."""


async def read_object(js: JetStreamContext, bucket: str, name: str) -> bytes:
    """An object of an object store (nats-py's layout: its info on `$O.<bucket>.M.<name>`, its
    chunks on `$O.<bucket>.C.<nuid>`), read chunk by chunk with direct gets."""
    stream = f"OBJ_{bucket}"
    meta = f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"
    try:
        raw = await js.get_last_msg(stream, meta, direct=True)
    except NotFoundError:
        raise StoredObjectMissing(name) from None
    try:
        info = ObjectInfo.from_response(json.loads(raw.data or b""))
    except (ValueError, TypeError, KeyError) as exc:
        raise StoredObjectCorrupt(f"{name}: unreadable object info") from exc
    if info.deleted:
        raise StoredObjectMissing(name)
    if not info.size:
        return b""
    chunks = f"$O.{bucket}.C.{info.nuid}"
    parts: list[bytes] = []
    size = 0
    async for _, chunk in replay(js, stream, chunks):
        parts.append(chunk.data or b"")
        size += len(parts[-1])
        if size >= info.size:
            break
        await asyncio.sleep(0)
    data = b"".join(parts)
    if len(data) != info.size:
        raise StoredObjectCorrupt(f"{name}: {len(data)} bytes of {info.size}")
    return data
