"""libs/common: canonical JSON and ids, log scrubbing, paging of large replies."""

from __future__ import annotations

import json
import logging

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
        {"msg": "sending with sk-live-abcdef123456", "levelname": "INFO", "name": "t", "header": "Authorization: Bearer zzz999"}
    )
    line = JsonFormatter().format(record)
    assert "sk-live-abcdef123456" not in line and "zzz999" not in line
    assert json.loads(line)["event"].startswith("sending with")
