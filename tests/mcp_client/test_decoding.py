"""`toolbus_mcp_client.decoding.BoundedDecoder`: bodies decode as zlib/gzip say, and a bomb stops
with at most one byte past the limit produced by any one read (bytes counted, no timing)."""

from __future__ import annotations

import gzip
import zlib

import pytest
from toolbus_mcp_client.decoding import STEP, BoundedDecoder, OverLimit, TooManyCodings

LIMIT = 1 << 20


def _reads(data: bytes, size: int = 65536) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_a_bomb_stops_at_the_limit_plus_one_byte_and_no_read_produces_more() -> None:
    co = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    bomb = b"".join(co.compress(b"\0" * (1 << 20)) for _ in range(64)) + co.flush()
    decoder = BoundedDecoder("gzip", LIMIT)
    produced: list[int] = []
    over = False
    for raw in _reads(bomb):
        try:
            produced.append(len(decoder.feed(raw)))
        except OverLimit:
            over = True
            break
    assert over
    assert sum(produced) <= LIMIT and max(produced, default=0) <= LIMIT + 1
    assert decoder.size <= LIMIT


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda d: zlib.compress(d)[2:-4]),  # raw deflate, as some servers send
        ("gzip, gzip", lambda d: gzip.compress(gzip.compress(d))),
        ("identity", lambda d: d),
        ("br", lambda d: d),  # not decoded here: passed on as it is
    ],
)
def test_bodies_decode_in_any_read_size(coding: str, encode: object) -> None:
    text = b"0123456789abcdef" * 5000
    wire = encode(text)  # type: ignore[operator]
    for size in (1, 7, 65536):
        decoder = BoundedDecoder(coding, LIMIT)
        out = b"".join(decoder.feed(r) for r in _reads(wire, size)) + decoder.flush()
        assert out == text and decoder.size == len(text)


def test_a_plain_body_over_the_limit_is_over() -> None:
    decoder = BoundedDecoder("", 10)
    assert decoder.feed(b"0123456789") == b"0123456789"
    with pytest.raises(OverLimit):
        decoder.feed(b"!")


def test_a_body_that_is_not_what_its_coding_says_is_a_zlib_error() -> None:
    with pytest.raises(zlib.error):
        BoundedDecoder("gzip", LIMIT).feed(b"\x1f\x8b not gzip")


def test_more_than_five_codings_are_refused_before_anything_is_decoded() -> None:
    decoder = BoundedDecoder(", ".join(["gzip"] * 6), LIMIT)
    assert decoder.decodes  # so a transport hands the body here, where it is refused
    with pytest.raises(TooManyCodings):
        decoder.feed(gzip.compress(b"x"))
    assert isinstance(TooManyCodings(), zlib.error)  # callers that map zlib.error map this too
    five = BoundedDecoder(", ".join(["gzip"] * 5), LIMIT)
    wire = b"payload"
    for _ in range(5):
        wire = gzip.compress(wire)
    assert five.feed(wire) + five.flush() == b"payload"


def test_a_bomb_decodes_in_pieces_of_at_most_step_bytes() -> None:
    bomb = gzip.compress(b"\0" * (4 * STEP + 5), 9)
    decoder = BoundedDecoder("gzip", 8 * STEP)
    pieces = list(decoder.pieces(bomb)) + list(decoder.flush_pieces())
    assert max(len(p) for p in pieces) <= STEP and len(pieces) >= 5
    assert sum(len(p) for p in pieces) == 4 * STEP + 5 == decoder.size
