"""A run's or call's events as stored in the EVENTS stream, read as a harness reads them: with
direct gets (the one JetStream request a client role may send; deploy/nats/README.md)."""

from __future__ import annotations

import json
from typing import Any

from toolbus._stored import replay


async def stored_events(nc: Any, stream: str, subject: str) -> list[dict[str, Any]]:
    """Every event stored on `subject` (wildcards allowed), oldest first."""
    return [json.loads(raw.data or b"null") async for _, raw in replay(nc.jetstream(), stream, subject)]
