"""RFC 8785 canonical JSON and the content ids built on it."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 (JCS) canonical form: the same JSON value always gives the same bytes."""
    return bytes(rfc8785.dumps(value))


def sha256_hex(value: Any) -> str:
    """Lowercase hex SHA-256 of the canonical JSON of `value`."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def content_id(prefix: str, value: Any) -> str:
    """`<prefix>` + the SHA-256 of the canonical JSON, e.g. `ts_…` for toolsets."""
    return prefix + sha256_hex(value)
