"""Call events on `events.calls.<runId>.<callId>`, captured by the `<P>_EVENTS` stream, that always
agree with the calls' state, each call's in order: the Lua script that changes a call writes its
event (and any command that goes with it) into the dispatcher's outbox in the same step (see
`lua/admit.lua`), and the shared outbox relay (`toolbus_common.outbox`) publishes them, in order
per call. After any crash or restart each call's events are in the stream exactly once, ending with
the outcome `calls.get` shows."""

from __future__ import annotations

from typing import Any

from toolbus_common.outbox import OutboxRelay


def order_key(msg_id: str) -> str:
    """The entries that must reach JetStream in outbox order share this key: a call's events and
    the commands written with them (`<callId>:<n>`, `park:<callId>:<n>`, `approvalNeeded:<callId>`)
    have the call id; anything else (`runClosed:<runId>`) is its own."""
    head, _, rest = msg_id.partition(":")
    if head in ("park", "approvalNeeded"):
        return rest.partition(":")[0]
    if head == "runClosed":
        return msg_id
    return head


class EventRelay(OutboxRelay):
    """The outbox relay of the dispatcher's outbox: in order per call (`order_key`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, order=order_key, **kwargs)
