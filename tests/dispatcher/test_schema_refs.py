"""Input schemas' `$ref`s resolve within the schema only: the dispatcher never fetches one (a
pinned schema could otherwise make it send a request past the allow-list, and wait on it)."""

from __future__ import annotations

import socket

import pytest
from toolbus_contracts.errors import InvalidInput
from toolbus_dispatcher.validation import SchemaCache


def test_a_remote_ref_is_not_fetched_and_the_input_is_invalid_input_saying_why() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/s.json"
        schema = {"type": "object", "properties": {"q": {"$ref": url}}}
        with pytest.raises(InvalidInput) as caught:
            SchemaCache().check("ts_1", "slowref", schema, {"q": 1})
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    assert caught.value.details == {"tool": "slowref", "ref": url}
    assert "does not fetch" in str(caught.value)


def test_local_and_meta_schema_refs_still_resolve() -> None:
    cache = SchemaCache()
    local = {
        "type": "object",
        "$defs": {"n": {"type": "integer"}},
        "properties": {"q": {"$ref": "#/$defs/n"}},
    }
    cache.check("ts_1", "local", local, {"q": 3})
    with pytest.raises(InvalidInput, match=r"at '\$\.q'"):
        cache.check("ts_1", "local", local, {"q": "x"})
    meta = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"schema": {"$ref": "http://json-schema.org/draft-07/schema#"}},
    }
    cache.check("ts_1", "meta", meta, {"schema": {"type": "string"}})
    with pytest.raises(InvalidInput):
        cache.check("ts_1", "meta", meta, {"schema": {"type": 5}})
