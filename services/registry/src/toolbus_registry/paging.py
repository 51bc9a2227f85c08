"""Paging of replies that would not fit in one NATS message: cursors are opaque strings that
encode where the next page starts and which document they page (a short digest of the toolset id
and what is paged)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, TypeVar

import orjson
from toolbus_common.cursors import opaque, unopaque
from toolbus_contracts.base import WireModel
from toolbus_contracts.errors import InvalidRequest

ENVELOPE_SLACK = 4096
"""Bytes kept free for the envelope and the fields around a page."""


def _scope_tag(scope: str) -> str:
    return hashlib.blake2s(scope.encode(), digest_size=6).hexdigest()


def encode_cursor(scope: str, offset: int) -> str:
    """The cursor of the page at `offset` of one document: `scope` names it (the toolset and what
    is paged, e.g. `ts_…:tools`, `ts_…:dts`), so a cursor is only taken back for that document."""
    return opaque(f"{_scope_tag(scope)}:{offset}")


def decode_cursor(cursor: str | None, scope: str, end: int) -> int:
    """Where the page `cursor` asks for starts (0 without one); a cursor that this service did not
    give for this very `scope`, or past `end` (the document's length: never given), is
    `invalidRequest` naming `cursor`."""
    if cursor is None:
        return 0
    try:
        tag, _, value = unopaque(cursor).partition(":")
        if not (value.isascii() and value.isdigit()):  # ASCII digits only
            raise ValueError
        offset = int(value)
        if str(offset) != value:  # a leading zero
            raise ValueError
        if offset >= end:  # a cursor is only given for a page that exists
            raise ValueError
    except ValueError:
        raise InvalidRequest(
            "Field 'cursor' is not a cursor this service gave.", details={"field": "cursor"}
        ) from None
    if tag != _scope_tag(scope):
        raise InvalidRequest(
            "Field 'cursor' was given for another toolset or another reply; page again from the "
            "first page, without a cursor.",
            details={"field": "cursor"},
        )
    return offset


def page_items(
    items: Sequence[dict[str, Any]], start: int, budget: int
) -> tuple[list[dict[str, Any]], int | None]:
    """Items from `start` whose JSON fits in `budget` bytes (at least one); the next offset or None."""
    out: list[dict[str, Any]] = []
    used = 0
    i = start
    while i < len(items):
        size = len(orjson.dumps(items[i])) + 1
        if out and used + size > budget:
            return out, i
        out.append(items[i])
        used += size
        i += 1
    return out, None


def page_text(text: str, start: int, budget: int) -> tuple[str, int | None]:
    """Characters from `start` whose JSON-escaped UTF-8 fits in `budget` bytes; the next offset or None."""
    if start > len(text):
        raise InvalidRequest(
            "Field 'cursor' points past the end of the document.", details={"field": "cursor"}
        )
    end = len(text)
    if len(orjson.dumps(text[start:])) <= budget:
        return text[start:], None
    # Escaping can grow a character to 6 bytes (\u00XX) or 4 (UTF-8); search the largest fit.
    lo, hi = start + 1, end
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(orjson.dumps(text[start:mid])) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[start:lo], lo


W = TypeVar("W", bound=WireModel)


def fitting(items: Sequence[W], budget: int) -> list[W]:
    """The leading `items` whose JSON fits in `budget` bytes together (for a reply that is not
    paged: search hits, best first; possibly none, when the first alone would not fit)."""
    out: list[W] = []
    used = 0
    for item in items:
        used += len(item.wire_json()) + 1
        if used > budget:
            break
        out.append(item)
    return out
