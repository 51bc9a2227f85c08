"""Paging keeps every page under the budget and loses nothing."""

from __future__ import annotations

import base64

import orjson
import pytest
from toolbus_contracts.errors import InvalidRequest
from toolbus_registry.paging import decode_cursor, encode_cursor, page_items, page_text


def test_text_pages_concatenate_to_the_whole() -> None:
    text = 'ab"c\\é\u2028😀\n' * 5000
    out, budget = "", 1000
    cursor: int | None = 0
    while cursor is not None:
        chunk, nxt = page_text(text, cursor, budget)
        assert len(orjson.dumps(chunk)) <= budget and chunk
        out += chunk
        cursor = nxt
    assert out == text


def test_item_pages_cover_every_item_once() -> None:
    items = [{"name": f"t{i}", "pad": "x" * (i % 50)} for i in range(500)]
    seen, start = [], 0
    while True:
        page, nxt = page_items(items, start, 2000)
        seen.extend(page)
        if nxt is None:
            break
        start = nxt
    assert seen == items


def test_cursors_round_trip_and_refuse_garbage() -> None:
    scope = "ts_" + "a" * 64 + ":tools"
    assert decode_cursor(encode_cursor(scope, 1234), scope, 1235) == 1234
    assert decode_cursor(None, scope, 0) == 0
    past_end = (encode_cursor(scope, 1235), encode_cursor(scope, 99999), encode_cursor(scope, 1234) + "x")
    tag = base64.urlsafe_b64decode(encode_cursor(scope, 1) + "==").decode().partition(":")[0]
    # written otherwise than this service writes them: a leading zero, an Arabic-Indic digit, padding
    unlike = [base64.urlsafe_b64encode(f"{tag}:{n}".encode()).decode().rstrip("=") for n in ("01", "\u0661")]
    unlike.append(encode_cursor(scope, 1) + "==")
    for bad in (
        "%%%",
        encode_cursor(scope, 1)[:-1] + "!",
        "eDox",
        encode_cursor(scope, 1)[:-2],
        *past_end,
        *unlike,
    ):
        with pytest.raises(InvalidRequest) as refused:
            decode_cursor(bad, scope, 1235)
        assert refused.value.details == {"field": "cursor"}


def test_a_cursor_pages_only_the_document_it_was_given_for() -> None:
    tools, dts = "ts_" + "a" * 64 + ":tools", "ts_" + "a" * 64 + ":dts"
    other = "ts_" + "b" * 64 + ":tools"
    for scope in (dts, other):
        with pytest.raises(InvalidRequest) as refused:
            decode_cursor(encode_cursor(tools, 7), scope, 100)
        assert "another toolset or another reply" in refused.value.message
        assert refused.value.details == {"field": "cursor"}


def test_search_hits_are_kept_best_first_while_they_fit_in_one_reply() -> None:
    from toolbus_contracts.registry import SearchHit
    from toolbus_registry.paging import fitting

    hits = [
        SearchHit(name=f"t{i}", namespace="t", prompt="p" * 100, dts="d" * 100, score=1.0 - i / 10)
        for i in range(5)
    ]
    one = len(hits[0].wire_json()) + 1
    assert fitting(hits, 10 * one) == hits
    assert fitting(hits, 3 * one) == hits[:3]
    assert fitting(hits, 3 * one - 1) == hits[:2]
    assert fitting(hits, one - 1) == []  # the first alone does not fit: none rather than too large


def test_opaque_cursors_read_back_only_what_they_write() -> None:
    from toolbus_common.cursors import opaque, unopaque

    for text in ("a:1", "b2c3:1234", "1733000000000:apr_x", "é:0"):
        assert unopaque(opaque(text)) == text
    # "YR" decodes to what "YQ" does ("a"): a second spelling, never written
    for bad in (opaque("a:1") + "==", opaque("a:1") + "\n", "!!", "\u00e9", "YR"):
        with pytest.raises(ValueError, match="not a cursor"):
            unopaque(bad)
