"""Replies: the envelope encoding, the guard that turns a reply that cannot be sent as built into
an error reply, and the checks that drop a request no service may answer."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import orjson
from faststream.middlewares import BaseMiddleware
from faststream.response.publish_type import PublishType
from toolbus_contracts import ToolbusError, WireModel, consumer_delivery, reply_error
from toolbus_contracts.errors import ErrorCode, Internal, OutputTooLarge, Unavailable

from toolbus_common.faults import is_backing_store_fault, is_redis_fault, unavailable
from toolbus_common.framework.metrics import REPLY_FAILURES
from toolbus_common.logging import Every
from toolbus_common.outages import REDIS

log = logging.getLogger("toolbus_common.bus")

HEADER_ROOM = 512
"""Bytes of `max_payload` left for the headers FastStream puts on a reply."""
DROPPED_LOG_EVERY = 60.0
"""Seconds between warnings of dropped consumer deliveries on one subject (a flood logs once)."""
_DROPPED_LOGGED = Every(DROPPED_LOG_EVERY)
_MISDIRECTED_LOGGED = Every(DROPPED_LOG_EVERY)


class RawJson(bytes):
    """A reply's `data` already encoded as JSON (a cached or pydantic-written body)."""


Result = WireModel | dict[str, Any] | RawJson | None


# ---- the guards -------------------------------------------------------------------------------


def misdirected_reply(prefix: str, reply: str | None) -> bool:
    """Whether a request's reply subject is one no service may answer on: a subject of this
    deployment (its events, its INTERNAL stream's commands) or of JetStream (`$JS`, `$KV`, `$O`).
    Replies go to inboxes (`_INBOX...`) and, across NATS accounts, to `_R_...`; a request naming
    another reply subject asks the service to write where its sender may not."""
    if not reply:
        return False
    return reply.startswith("$") or reply.startswith(prefix + ".")


def refused_reply(subscribed: str, reply: str) -> None:
    """Log (once a minute per subject) a request dropped for its misdirected reply subject."""
    if _MISDIRECTED_LOGGED.due(subscribed):
        log.warning(
            "dropped a request whose reply subject is not an inbox: someone asked for the answer "
            "to go where only services write (only the first a minute is logged)",
            extra={"subject": subscribed, "reply": reply[:200]},
        )


def handed_out(subscribed: str, subject: str, reply: str | None, headers: Any) -> bool:
    """Whether a message on a core subscription is a stored one JetStream handed out
    (`consumer_delivery`), to be dropped unanswered; said at most once a minute per subject."""
    if not consumer_delivery(subscribed, subject, reply, headers):
        return False
    if _DROPPED_LOGGED.due(subscribed):
        log.warning(
            "dropped a message a JetStream consumer delivered here: someone aimed a consumer's "
            "deliveries at this subject (only the first a minute is logged)",
            extra={"subject": subscribed},
        )
    return True


# ---- encoding and the reply guard -------------------------------------------------------------


def encode_ok(result: Result) -> bytes:
    if isinstance(result, RawJson):
        return b'{"ok":true,"data":' + result + b"}"
    if result is None:
        data: Any = {}
    elif isinstance(result, WireModel):
        data = result.wire()
    else:
        data = result
    return orjson.dumps({"ok": True, "data": data})


def encode_error(error: ToolbusError) -> bytes:
    return orjson.dumps(reply_error(error))


def too_large(size: int, max_payload: int) -> bytes:
    REPLY_FAILURES.labels("tooLarge").inc()
    return encode_error(
        OutputTooLarge(
            f"The reply ({size} bytes) does not fit in one NATS message (max_payload {max_payload}); "
            "narrow the request.",
            details={"size": size, "maxPayload": max_payload},
        )
    )


def publish_failed(exc: BaseException) -> bytes:
    """The reply sent when publishing the built reply failed (the connection is the store here)."""
    REPLY_FAILURES.labels("publishFailed").inc()
    if isinstance(exc, nats.errors.MaxPayloadError):
        return encode_error(OutputTooLarge("The reply does not fit in one NATS message; narrow the request."))
    return encode_error(
        Unavailable(
            "The reply could not be sent (the NATS connection is busy or reconnecting); "
            "send the request again.",
            details={"store": "NATS"},
        )
    )


def failure(exc: Exception, subject: str) -> ToolbusError:
    """The error reply for an exception a handler raised."""
    if isinstance(exc, ToolbusError):
        return exc
    if is_backing_store_fault(exc):
        if is_redis_fault(exc):  # one warning per outage, and the count when it ends
            REDIS.fault(exc)
            REDIS.answered_unavailable()
        else:
            log.warning("request failed: backing store unavailable", extra={"subject": subject})
        return unavailable(exc)
    log.exception("request failed", extra={"subject": subject})
    return Internal("toolbus failed to handle this request; it was logged, try again.")


def encode_reply(result: Result, subject: str, limit: int, max_payload: int) -> tuple[bytes, str]:
    """The reply body for `result` and its result code, guarded: never larger than `limit`."""
    try:
        body = encode_ok(result)
    except Exception:
        REPLY_FAILURES.labels("notSerializable").inc()
        log.exception("reply is not serializable", extra={"subject": subject})
        return encode_error(Internal("toolbus built a reply it cannot encode; it was logged.")), "internal"
    if len(body) > limit:
        log.warning("reply too large", extra={"subject": subject, "size": len(body)})
        return too_large(len(body), max_payload), ErrorCode.OUTPUT_TOO_LARGE.value
    return body, "ok"


class ReplyGuard(BaseMiddleware):
    """FastStream middleware: when publishing a reply fails, publish the error reply instead."""

    async def publish_scope(self, call_next: Callable[[Any], Awaitable[Any]], cmd: Any) -> Any:
        try:
            return await call_next(cmd)
        except Exception as exc:
            if getattr(cmd, "publish_type", None) is not PublishType.REPLY:
                raise
            log.warning("reply publish failed", extra={"error": type(exc).__name__})
            cmd.body = publish_failed(exc)
            try:
                return await call_next(cmd)
            except Exception as again:
                log.error("error reply publish failed too", extra={"error": type(again).__name__})
                return None
