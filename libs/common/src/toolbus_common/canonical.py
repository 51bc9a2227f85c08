"""RFC 8785 canonical JSON and the content ids built on it."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import rfc8785


def _byte_classes() -> bytes:
    """A `bytes.translate` table that keeps only what the fast path must look at: digits become
    `0`, `.`/`e`/`E` become `.`, the bytes a number may follow (`:`, `,`, `[`) become `:`, `-`
    stays, the lead bytes of 4-byte UTF-8 sequences (characters outside the Basic Multilingual
    Plane) become `!`, and everything else a space."""
    table = bytearray(b" " * 256)
    for byte in b"0123456789":
        table[byte] = ord("0")
    for byte in b".eE":
        table[byte] = ord(".")
    for byte in b":,[":
        table[byte] = ord(":")
    table[ord("-")] = ord("-")
    for byte in range(0xF0, 0xF5):
        table[byte] = ord("!")
    return bytes(table)


_CLASSES = _byte_classes()
# In the classified bytes: a number token that is a float (digits then `.` or an exponent), or an
# integer of 16+ digits, which JCS may not represent exactly. orjson writes no whitespace, so every
# number follows `:`, `,` or `[`; the same bytes inside a string (a description saying "1:5.5") only
# send that value down the slower exact path.
_FLOAT = re.compile(rb":-?0+\.")
_LONG = b"0" * 16
_SAFE_INT = 2**53 - 1


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 (JCS) canonical form: the same JSON value always gives the same bytes.

    Fast path: for values with no floats, no long integers and no characters outside the Basic
    Multilingual Plane, orjson with sorted keys writes exactly the JCS bytes (same escaping;
    code-point order equals UTF-16 order there). Anything else goes through the reference
    implementation (`rfc8785`), ~50x slower on a 1,000-tool toolset. Integers beyond 2**53, which
    `rfc8785` refuses, are taken as the IEEE doubles JCS defines numbers to be.
    """
    if not isinstance(value, dict | list):
        return _reference(value)  # a lone scalar: nothing to gain
    try:
        fast = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits and other values orjson refuses
        return _reference(value)
    classes = fast.translate(_CLASSES)  # C speed; the checks below then search few byte values
    if b"!" in classes or _LONG in classes or (b"0." in classes and _FLOAT.search(classes)):
        return _reference(value)
    return fast


def numbers_exact(canonical: bytes) -> bool:
    """Whether every number in this canonical JSON reads back as the value it was made from. JCS
    writes an integer beyond 2**53 as the double it rounds to, so JSON with a run of 16 or more
    digits may not (digits inside strings count too: a cheap check, erring on the safe side)."""
    return _LONG not in canonical.translate(_CLASSES)


def canonical_members(members: Mapping[str, bytes]) -> bytes:
    """The canonical JSON of an object whose member values are canonical JSON already: lets a
    large value be canonicalised part by part (and the parts be reused)."""
    keys = sorted(members, key=lambda k: k.encode("utf-16-be"))  # JCS orders by UTF-16 units
    return b"{" + b",".join(_reference(k) + b":" + members[k] for k in keys) + b"}"


def canonical_array(items: Sequence[bytes]) -> bytes:
    """The canonical JSON of an array whose items are canonical JSON already."""
    return b"[" + b",".join(items) + b"]"


_I64_MIN, _U64_MAX = -(2**63), 2**64 - 1


def _ints_as_doubles(value: Any, low: int, high: int) -> Any:
    """`value` with every integer outside [low, high] turned into its IEEE double."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return float(value) if value < low or value > high else value
    if isinstance(value, dict):
        return {k: _ints_as_doubles(v, low, high) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_ints_as_doubles(v, low, high) for v in value]
    return value


def json_safe(value: Any) -> Any:
    """`value` with the integers orjson cannot write (beyond 64 bits) turned into the IEEE doubles
    RFC 8785 takes every number for, so what is hashed is also what can be stored and sent."""
    return _ints_as_doubles(value, _I64_MIN, _U64_MAX)


def _reference(value: Any) -> bytes:
    return bytes(rfc8785.dumps(_ints_as_doubles(value, -_SAFE_INT, _SAFE_INT)))


def sha256_hex(value: Any) -> str:
    """Lowercase hex SHA-256 of the canonical JSON of `value`."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def content_id(prefix: str, value: Any) -> str:
    """`<prefix>` + the SHA-256 of the canonical JSON, e.g. `ts_…` for toolsets."""
    return prefix + sha256_hex(value)
