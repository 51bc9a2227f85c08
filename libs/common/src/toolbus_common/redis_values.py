"""Values as redis-py hands them back (bytes, or str on a decoding connection) read as text."""

from __future__ import annotations

from typing import Any


def text(value: Any) -> str:
    """`value` as str: bytes decoded as UTF-8, anything else through `str`."""
    return value.decode() if isinstance(value, bytes) else str(value)
