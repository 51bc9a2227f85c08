"""Bounded decoding of an HTTP body's `Content-Encoding` (gzip, deflate): a compressed body is
inflated in pieces of at most `STEP` bytes (`zlib.decompressobj().decompress(data, STEP)`, the
input left over kept for the next piece), counted as they come, so a "gzip bomb" costs the limit,
not its decoded size, and no one piece holds the CPU long: an async reader yields to its event
loop between pieces (`pieces`). httpx/httpx2 decode each read whole (a 64 KiB read of zeros
inflates to 64 MiB before any cap can look at it): bodies that are capped are read raw and decoded
here instead.

At most `MAX_CODINGS` codings are taken (curl's bound): a `Content-Encoding` that lists more is
refused (`TooManyCodings`, a `zlib.error`) before anything is decoded, as a server that lists
`gzip` thousands of times would otherwise have each read inflated through thousands of layers.
Codings other than gzip/deflate (and `identity`) are passed on as they are, as httpx does for a
coding it has no decoder for; toolbus asks for `gzip, deflate` only.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

DECODED = frozenset({"gzip", "x-gzip", "deflate"})
MAX_CODINGS = 5
"""The most content codings a response may list (curl refuses more than 5)."""
STEP = 256 * 1024
"""The most decoded bytes one `decompress` call produces (a few milliseconds of CPU)."""


class OverLimit(Exception):
    """The decoded body is longer than the limit (decoding stopped there)."""


class TooManyCodings(zlib.error):
    """The body lists more than `MAX_CODINGS` content codings: it is not decoded at all."""


def codings(content_encoding: str) -> list[str]:
    """The codings a `Content-Encoding` value lists, in the order they were applied."""
    return [c.strip().lower() for c in content_encoding.split(",") if c.strip()]


class _Inflate:
    """One zlib coding, decoded in pieces of at most `STEP` bytes."""

    __slots__ = ("_d", "_head", "_sniff")

    def __init__(self, coding: str) -> None:
        gzip = coding in ("gzip", "x-gzip")
        self._d = zlib.decompressobj(zlib.MAX_WBITS | 16 if gzip else zlib.MAX_WBITS)
        # deflate: zlib-wrapped as the RFC says, or raw as some servers send it; the input is
        # kept until the wrapped form has produced output, to be decoded again as raw if it fails.
        self._sniff = not gzip
        self._head = b""

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of `data`, in pieces of at most `STEP` bytes (every byte of `data`
        consumed once the iterator ends)."""
        while True:
            if self._sniff:
                self._head += data
                try:
                    out = self._d.decompress(data, STEP)
                except zlib.error:
                    self._sniff = False
                    self._d = zlib.decompressobj(-zlib.MAX_WBITS)
                    out = self._d.decompress(self._head, STEP)
                    self._head = b""
                else:
                    if out or len(self._head) > 65536:  # decided (and the kept input stays small)
                        self._sniff = False
                        self._head = b""
            else:
                out = self._d.decompress(data, STEP)
            data = self._d.unconsumed_tail
            if out:
                yield out
            if not data and len(out) < STEP:
                return

    def flush(self) -> bytes:
        return self._d.flush()  # all input was consumed piece by piece: what is left is small


class BoundedDecoder:
    """Decodes a body chunk by chunk and counts it: `feed`/`pieces` raise `OverLimit` once more
    than `limit` decoded bytes came out in all, and `zlib.error` for a body that does not decode
    (`TooManyCodings` for one that lists more than `MAX_CODINGS`)."""

    __slots__ = ("_codings", "_limit", "_refused", "size")

    def __init__(self, content_encoding: str, limit: int) -> None:
        names = codings(content_encoding)
        self._refused = len(names) > MAX_CODINGS
        # The last coding named was applied last, so it is undone first.
        self._codings = [] if self._refused else [_Inflate(c) for c in reversed(names) if c in DECODED]
        self._limit = limit
        self.size = 0
        """Decoded bytes so far."""

    @property
    def decodes(self) -> bool:
        """True when the body is encoded in a coding decoded here (or lists too many to take)."""
        return bool(self._codings) or self._refused

    def pieces(self, data: bytes, start: int = 0) -> Iterator[bytes]:
        """The decoded bytes of the next raw read, in pieces of at most `STEP` bytes each (an
        async reader awaits between them, so that a big body does not hold its event loop)."""
        if self._refused:
            raise TooManyCodings(f"more than {MAX_CODINGS} content codings")
        for piece in self._through(data, start):
            if self.size + len(piece) > self._limit:
                raise OverLimit
            self.size += len(piece)
            yield piece

    def _through(self, data: bytes, i: int) -> Iterator[bytes]:
        if i == len(self._codings):
            if data:
                yield data
            return
        for piece in self._codings[i].pieces(data):
            yield from self._through(piece, i + 1)

    def feed(self, data: bytes, start: int = 0) -> bytes:
        """The decoded bytes of the next raw read."""
        return b"".join(self.pieces(data, start))

    def flush(self) -> bytes:
        """What the codings held back once the raw body ended."""
        return b"".join(self.flush_pieces())

    def flush_pieces(self) -> Iterator[bytes]:
        """`flush` in pieces, as `pieces` gives a read."""
        if self._refused:
            raise TooManyCodings(f"more than {MAX_CODINGS} content codings")
        for i, coding in enumerate(self._codings):
            yield from self.pieces(coding.flush(), i + 1)
