"""Outputs by reference: an outcome whose reply would not fit in one NATS message keeps its output
in the JetStream object store `‹P›_outputs` (one object per call, named by its callId, the JSON
text of the output) and carries `outputRef` instead: `{"bucket", "name", "size", "sha256"}`.

The reply of `calls.invoke`, `calls.get` and the `completed` event then all carry the same small
outcome, whatever the tool returned; any JetStream object-store client reads the output back.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import orjson
from nats.js import JetStreamContext
from nats.js.object_store import ObjectStore
from toolbus_common.connections import DEFAULT_PLACEMENT, JsPlacement, ensure_object_store

from toolbus_dispatcher.outcomes import failed

ENVELOPE_ROOM = 16 * 1024
"""Bytes of a NATS message kept for what surrounds an outcome (reply envelope, event fields)."""
MIN_INLINE = 4096


def inline_limit(configured: int | None, max_payload: int) -> tuple[int, bool]:
    """The largest outcome sent inline: `configured` (`TOOLBUS_DISPATCHER_INLINE_OUTPUT_BYTES`),
    else, and at most, what fits in one NATS message with its envelope (the server's
    `max_payload` less `ENVELOPE_ROOM`, at least `MIN_INLINE`): above that JetStream would refuse
    the `completed` event for ever. Second: whether `configured` was lowered to fit."""
    fits = max(MIN_INLINE, max_payload - ENVELOPE_ROOM)
    if configured is None:
        return fits, False
    return (fits, True) if configured > fits else (configured, False)


def _in_room(outcome: Any) -> list[Any]:
    """`outcome` inside 8 arrays: the levels kept free around an outcome, as the replies and events
    that carry it (`{"ok", "data": {"outcome": ...}}`) nest it a few levels deep, and orjson
    writes at most 254."""
    return [[[[[[[[outcome]]]]]]]]


_ROOM = orjson.dumps(_in_room(0)).index(b"0")
"""How many levels `_in_room` adds (one `[` each)."""
OUTPUT_DEPTH_MAX = 254 - _ROOM - 1
"""The deepest output an outcome (`{"status", "output"}`) carries."""


def dumps_with_room(outcome: dict[str, Any]) -> memoryview | None:
    """The outcome's JSON (a view of it), or None when it nests too deep to be sent inside a
    reply or an event. It is written `_in_room`, in the same single pass that writes it: orjson
    refuses what would nest past its limit there; the view leaves the brackets out."""
    try:
        text = orjson.dumps(_in_room(outcome))
    except orjson.JSONEncodeError as exc:
        if "Recursion limit" not in str(exc):
            raise
        return None
    return memoryview(text)[_ROOM:-_ROOM]


_OK_PREFIX: Final = b'{"status":"ok","output":'
"""How the JSON of an `ok(output)` outcome starts: the output's JSON follows, then `}`."""


class _Reader:
    """A view read in chunks by the object store's `put` (which copies a chunk at a time)."""

    __slots__ = ("_at", "_view")

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._at = 0

    def readinto(self, buffer: bytearray) -> int:
        part = self._view[self._at : self._at + len(buffer)]
        buffer[: len(part)] = part
        self._at += len(part)
        return len(part)


def output_json(outcome: dict[str, Any], text: memoryview) -> memoryview:
    """The JSON of an ok outcome's output: the part of the outcome's JSON `text` that holds it (a
    view: no copy of a large output), or written anew for an outcome of another shape."""
    if list(outcome) == ["status", "output"] and text[: len(_OK_PREFIX)].tobytes() == _OK_PREFIX:
        return text[len(_OK_PREFIX) : -1]
    return memoryview(orjson.dumps(outcome.get("output")))


class OutputStore:
    """Writes outputs too large to travel inline; `inline_limit` is the largest inline outcome."""

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        *,
        ttl: float,
        inline_limit: int,
        placement: JsPlacement = DEFAULT_PLACEMENT,
    ) -> None:
        self._js = js
        self._placement = placement
        self.bucket = bucket
        self._ttl = ttl
        self.inline_limit = inline_limit
        self._store: ObjectStore | None = None

    async def open(self) -> None:
        """Create the store, or bring an existing one to the settings: replicas, size limit and the
        TTL the settings give now (it follows the run retention)."""
        self._store = await ensure_object_store(
            self._js, self.bucket, placement=self._placement, ttl=self._ttl
        )

    async def outcome_json(self, call_id: str, outcome: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(stored JSON, wire dict) of an outcome: as it is when it fits, else with its output
        written to the object store and `outputRef` in its place. Raises what JetStream raises
        when the store does not answer (the caller retries: nothing is final yet)."""
        text = dumps_with_room(outcome)
        if text is None:
            outcome = failed(
                "upstreamError",
                f"The tool's output nests deeper than JSON writers carry ({OUTPUT_DEPTH_MAX} levels "
                "of arrays and objects); it was not stored.",
            )
            text = memoryview(orjson.dumps(outcome))
        if len(text) <= self.inline_limit or outcome.get("status") != "ok":
            return str(text, "utf-8"), outcome
        ref = await self.put(call_id, output_json(outcome, text))
        small = {"status": "ok", "outputRef": ref}
        return orjson.dumps(small).decode(), small

    async def put(self, name: str, data: bytes | memoryview) -> dict[str, Any]:
        """Store `data` as object `name`, read a chunk at a time (no copy of the whole); its ref."""
        if self._store is None:
            await self.open()
        assert self._store is not None
        source: Any = data if isinstance(data, bytes) else _Reader(data)
        await self._store.put(name, source)
        return {
            "bucket": self.bucket,
            "name": name,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
