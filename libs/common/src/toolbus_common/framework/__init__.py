"""The service framework: the one serving layer of every service, a FastStream `NatsBroker` per
service (`bus`), route tables that handlers declare themselves on (`routes`), replies and their
guards (`replies`), the one policy for durable internal commands (`commands`), the AsyncAPI
document (`asyncapi`) and the metrics (`metrics`). `toolbus_common.bus` re-exports the names.

    routes = Routes()

    @routes.request(lambda s: s.approvals_list)
    async def handle_list(approvals: Approvals, request: ApprovalsListRequest) -> ApprovalsListReply:
        return ApprovalsListReply(approvals=await approvals.pending(...))

    bus = Bus(settings, name="approval", queue="toolbus-approval")
    nc = await bus.connect()          # the broker's nats-py connection, for stores and publishers
    bus.include(routes, approvals)    # bind the table to the object its handlers take first
    await bus.start()

What each kind of entry promises:
- `request`: the body is parsed strictly with the handler's annotated model (`invalidRequest`
  naming the field), the handler is called, and exactly one reply goes back with the envelope.
  A backing-store fault is `unavailable`, any other exception `internal`. A reply that cannot be
  sent as built becomes an error reply (`ReplyGuard`): too large for the connection's
  `max_payload` → `outputTooLarge`, not JSON-serializable → `internal`, publish failed →
  `unavailable` (sent once more; a connection that is gone cannot answer at all).
  `fast=True` entries are served by a raw nats-py subscription in the same process (FastStream's
  per-message cost, measured by `bench/transport.py`, is over the hot path's budget; see
  docs/design.md); they behave the same and appear in the AsyncAPI document alike.
- `deferred`: like `request` (always raw), but the handler also gets the reply subject and may
  answer later from anywhere (`calls.invoke`: the replica that finishes the call answers); it
  returns the reply now or `None`. `Bus.reply` is the guarded publish for such later answers.
- `command`: a durable JetStream pull consumer on the INTERNAL stream, shared by every replica
  (each command applied once), handed to FastStream. Acked after the handler returned; a body
  that does not parse, or a non-retryable `ToolbusError`, is dead-lettered
  (`‹p›.internal.deadletter.<rest>`, kept in the same stream, headers say why) and terminated; a
  backing-store fault or a retryable error is retried after `RETRY_DELAY`, without limit; any
  other failure is retried with a growing delay and dead-lettered after `MAX_DELIVERIES`.
- `listen`: a raw subscription with no reply (host heartbeats and results), each message in its
  own task; documented with its model.
- `event`: a subject this service publishes, documented with its model (publishing itself stays
  on the nats-py connection, batched where the hot path needs it).
"""

from __future__ import annotations

from toolbus_common.framework.asyncapi import asyncapi_document, iter_subjects
from toolbus_common.framework.bus import MAX_WORKERS, Bus, broker_options
from toolbus_common.framework.commands import (
    ACK_WAIT,
    INTERNAL_STREAM,
    MAX_DELIVERIES,
    PULL_TIMEOUT,
    RETRY_DELAY,
    Commands,
)
from toolbus_common.framework.metrics import COMMANDS, LATENCY, REPLY_FAILURES, REQUESTS, served
from toolbus_common.framework.replies import (
    HEADER_ROOM,
    RawJson,
    ReplyGuard,
    Result,
    encode_error,
    encode_ok,
    encode_reply,
    failure,
    misdirected_reply,
    publish_failed,
    too_large,
)
from toolbus_common.framework.routes import REQUEST_HEADERS, Entry, Routes, SubjectOf

__all__ = [
    "ACK_WAIT",
    "COMMANDS",
    "HEADER_ROOM",
    "INTERNAL_STREAM",
    "LATENCY",
    "MAX_DELIVERIES",
    "MAX_WORKERS",
    "PULL_TIMEOUT",
    "REPLY_FAILURES",
    "REQUESTS",
    "REQUEST_HEADERS",
    "RETRY_DELAY",
    "Bus",
    "Commands",
    "Entry",
    "RawJson",
    "ReplyGuard",
    "Result",
    "Routes",
    "SubjectOf",
    "asyncapi_document",
    "broker_options",
    "encode_error",
    "encode_ok",
    "encode_reply",
    "failure",
    "iter_subjects",
    "misdirected_reply",
    "publish_failed",
    "served",
    "too_large",
]
