"""Opaque cursors on the wire: URL-safe base64 of a short text, without padding. A service reads
back only what it writes, character for character (no stray padding, no other spelling)."""

from __future__ import annotations

import base64


def opaque(text: str) -> str:
    """The cursor that stands for `text`."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def unopaque(cursor: str) -> str:
    """The text `opaque` turned into `cursor`; ValueError for anything `opaque` does not write."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except ValueError:  # not base64 (binascii.Error), not ASCII, not UTF-8 once decoded
        raise ValueError("not a cursor") from None
    if opaque(text) != cursor:
        raise ValueError("not a cursor")
    return text
