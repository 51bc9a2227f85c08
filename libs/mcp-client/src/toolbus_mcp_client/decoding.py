"""Bounded decoding of an HTTP body's `Content-Encoding` (gzip, deflate): a compressed body is
inflated one network read at a time, each read at most one byte past what is left under the
limit (`zlib.decompressobj().decompress(data, max_length)`), so a "gzip bomb" costs the limit, not
its decoded size. httpx/httpx2 decode each read whole (a 64 KiB read of zeros inflates to 64 MiB
before any cap can look at it): bodies that are capped are read raw and decoded here instead.

Codings other than gzip/deflate (and `identity`) are passed on as they are, as httpx does for a
coding it has no decoder for; toolbus asks for `gzip, deflate` only.
"""

from __future__ import annotations

import zlib

DECODED = frozenset({"gzip", "x-gzip", "deflate"})


class OverLimit(Exception):
    """The decoded body is longer than the limit (decoding stopped there)."""


class _Inflate:
    """One zlib coding, decoded at most `room + 1` bytes per read."""

    __slots__ = ("_d", "_head", "_sniff")

    def __init__(self, coding: str) -> None:
        gzip = coding in ("gzip", "x-gzip")
        self._d = zlib.decompressobj(zlib.MAX_WBITS | 16 if gzip else zlib.MAX_WBITS)
        # deflate: zlib-wrapped as the RFC says, or raw as some servers send it; the input is
        # kept until the wrapped form has produced output, to be decoded again as raw if it fails.
        self._sniff = not gzip
        self._head = b""

    def decode(self, data: bytes, room: int) -> bytes:
        """At most `room + 1` decoded bytes of `data` (one more than fits tells "over"; the input
        left then is dropped). Output within `room` means every byte of `data` was consumed."""
        if self._sniff:
            self._head += data
            try:
                out = self._d.decompress(data, room + 1)
            except zlib.error:
                self._sniff = False
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
                return self._d.decompress(self._head, room + 1)
            if out or len(self._head) > 65536:  # decided (and the kept input stays small)
                self._sniff = False
                self._head = b""
            return out
        return self._d.decompress(data, room + 1)

    def flush(self) -> bytes:
        return self._d.flush()  # all input was consumed within the limit: what is left is small


class BoundedDecoder:
    """Decodes a body chunk by chunk and counts it: `feed` raises `OverLimit` once more than
    `limit` decoded bytes came out in all, and `zlib.error` for a body that does not decode."""

    __slots__ = ("_codings", "_limit", "size")

    def __init__(self, content_encoding: str, limit: int) -> None:
        names = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
        # The last coding named was applied last, so it is undone first.
        self._codings = [_Inflate(c) for c in reversed(names) if c in DECODED]
        self._limit = limit
        self.size = 0
        """Decoded bytes so far."""

    @property
    def decodes(self) -> bool:
        """True when the body is encoded in a coding decoded here."""
        return bool(self._codings)

    def feed(self, data: bytes, start: int = 0) -> bytes:
        """The decoded bytes of the next raw read."""
        for coding in self._codings[start:]:
            data = coding.decode(data, self._limit - self.size)
            if len(data) > self._limit - self.size:
                raise OverLimit
        self.size += len(data)
        if self.size > self._limit:
            raise OverLimit
        return data

    def flush(self) -> bytes:
        """What the codings held back once the raw body ended."""
        out = []
        for i, coding in enumerate(self._codings):
            out.append(self.feed(coding.flush(), i + 1))
        return b"".join(out)
