"""Timestamps as the contract writes them."""

from __future__ import annotations

import time
from datetime import UTC, datetime

_last: tuple[int, str] = (-1, "")


def now_iso() -> str:
    """Current UTC time, RFC 3339 with milliseconds and `Z`.

    Formatted once per millisecond: a call through the dispatcher stamps half a dozen events and
    records, and formatting a `datetime` costs more than the rest of making an event."""
    global _last
    ms = time.time_ns() // 1_000_000
    last = _last
    if last[0] == ms:
        return last[1]
    moment = datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=ms % 1000 * 1000)
    text = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    _last = (ms, text)
    return text
