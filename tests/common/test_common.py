"""libs/common: canonical JSON and ids, log scrubbing, paging of large replies."""

from __future__ import annotations

import json
import logging
from typing import Any

from toolbus_common.canonical import canonical_json, content_id
from toolbus_common.logging import JsonFormatter, register_secret


def test_canonical_json_is_rfc8785() -> None:
    assert canonical_json({"b": 1, "a": [1.0, "é", None]}) == b'{"a":[1,"\xc3\xa9",null],"b":1}'
    assert canonical_json({"x": 1e21}) == b'{"x":1e+21}'


def test_content_id_ignores_key_order() -> None:
    a = content_id("ts_", {"a": 1, "b": {"c": 2, "d": 3}})
    b = content_id("ts_", {"b": {"d": 3, "c": 2}, "a": 1})
    assert a == b and a.startswith("ts_") and len(a) == 67


def test_log_lines_never_carry_secrets() -> None:
    register_secret("sk-live-abcdef123456")
    record = logging.makeLogRecord(
        {
            "msg": "sending with sk-live-abcdef123456",
            "levelname": "INFO",
            "name": "t",
            "header": "Authorization: Bearer zzz999",
        }
    )
    line = JsonFormatter().format(record)
    assert "sk-live-abcdef123456" not in line and "zzz999" not in line
    assert json.loads(line)["event"].startswith("sending with")


def test_an_extra_never_takes_the_place_of_the_line_s_own_keys() -> None:
    """The credentials service logged `extra={"level": "toolset"}`: its warnings read as `toolset`."""
    record = logging.makeLogRecord(
        {"name": "t", "levelno": logging.WARNING, "levelname": "WARNING", "msg": "expired"}
        | {"level": "toolset", "event": "x"}
    )
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "warning" and line["event"] == "expired"
    assert line["level_"] == "toolset" and line["event_"] == "x"


def test_fast_canonical_form_matches_the_reference() -> None:
    import rfc8785

    from tests.support.mcp_servers import synthetic_tools

    samples: list[Any] = [
        {"z": 1, "a": {"y": [1, 2, {"b": None, "a": True}]}, "é": "ü", "\u00e9a": "x"},
        {
            "ctl": '\x00\x01\x1f\x7f"\\/\b\f\n\r\t',
            "u2028": "\u2028\u2029",
            "int": 2**53 - 1,
            "neg": -(2**53 - 1),
        },
        {"float": 0.5, "int_float": 1.0, "exp": 1e21, "small": 5e-324},
        {"emoji": "😀", "😀": 1, "\ufb01": 2},
        synthetic_tools(50),
        ["", [], {}, 0, -0, False],
        1.5,
        [2.5e-7],
        {"text": "ratio 1:5.5, [3.0e2] and 12345678901234567 inside a string"},
        9007199254740991,
        {"k": [1, -2.5], "e": -1e-7, "long": 1234567890123456, "neg": [-7]},
    ]
    for sample in samples:
        assert canonical_json(sample) == bytes(rfc8785.dumps(sample)), sample


def test_integers_beyond_the_double_range_are_taken_as_doubles() -> None:
    assert canonical_json({"max": 2**63 - 1}) == b'{"max":9223372036854776000}'
    assert canonical_json({"huge": 2**70}) == canonical_json({"huge": float(2**70)})


def test_canonical_json_can_be_assembled_from_canonical_parts() -> None:
    from toolbus_common.canonical import canonical_array, canonical_members

    parts = {"zeta": [1, {"b": 2.5, "a": "😀"}], "alpha": {"x": None}, "\u00e9": "e", "Z": []}
    assembled = canonical_members(
        {k: canonical_json(v) for k, v in parts.items() if k != "zeta"}
        | {"zeta": canonical_array([canonical_json(v) for v in parts["zeta"]])}
    )
    assert assembled == canonical_json(parts)


def test_now_iso_is_rfc3339_milliseconds_utc_and_current() -> None:
    import re
    from datetime import UTC, datetime

    from toolbus_common.clock import now_iso

    before = datetime.now(UTC)
    text = now_iso()
    after = datetime.now(UTC)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", text)
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= stamp <= after


def test_json_safe_turns_only_what_orjson_cannot_write_into_doubles() -> None:
    import orjson
    from toolbus_common.canonical import json_safe

    value = {"big": 2**64, "neg": -(2**63) - 1, "ok": [2**63, -(2**63), 1, True, None, 1.5, "2"]}
    safe = json_safe(value)
    assert safe == {
        "big": float(2**64),
        "neg": float(-(2**63) - 1),
        "ok": [2**63, -(2**63), 1, True, None, 1.5, "2"],
    }
    assert orjson.loads(orjson.dumps(safe)) == safe
    assert canonical_json(safe) == canonical_json(value)


async def test_cancel_and_wait_ends_a_loop_that_swallowed_one_cancellation() -> None:
    import asyncio

    from toolbus_common.tasks import cancel_and_wait

    swallowed: list[bool] = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)  # as a client that catches the cancellation would

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await cancel_and_wait(task, timeout=5)
    assert task.cancelled() and swallowed == [True]


def test_lru_keeps_the_most_recent_within_its_weight() -> None:
    from toolbus_common.lru import Lru

    cache: Lru[str, bytes] = Lru(100, weight=lambda _, value: len(value))
    for key in "abc":
        cache.put(key, b"x" * 40)
    assert cache.get("a") is None and cache.get("b") is not None and cache.get("c") is not None
    cache.put("big", b"y" * 500)  # heavier than the capacity: kept alone
    assert cache.get("big") is not None and cache.get("c") is None and len(cache) == 1
    counted: Lru[str, int] = Lru(2)
    for i, key in enumerate("xyz"):
        counted.put(key, i)
    assert "x" not in counted and counted.get("y") == 1 and counted.get("z") == 2
