"""Streams and buckets take their limits from settings, and a deployment whose settings changed
brings an existing stream up to date (on the session's NATS, under the session's prefix)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from toolbus_common.connections import JsPlacement, ensure_kv, ensure_object_store, ensure_stream

from tests.support.infra import js_name

pytestmark = pytest.mark.integration


async def test_stream_limits_are_applied_and_updated(nc: Any, prefix: str) -> None:
    js = nc.jetstream()
    name = js_name(prefix, "LIMITS")
    subjects = [f"{prefix}.limits.>"]
    await ensure_stream(js, name, subjects, max_age=timedelta(hours=1), max_bytes=1 << 20)
    info = await js.stream_info(name)
    assert (info.config.max_age, info.config.max_bytes, info.config.num_replicas) == (3600, 1 << 20, 1)
    await ensure_stream(js, name, subjects, max_age=timedelta(hours=2), max_bytes=2 << 20)
    info = await js.stream_info(name)
    assert (info.config.max_age, info.config.max_bytes) == (7200, 2 << 20)


async def test_buckets_take_placement_and_size_limits(nc: Any, prefix: str) -> None:
    js = nc.jetstream()
    placement = JsPlacement(replicas=1, max_bytes=4 << 20)
    await ensure_kv(js, js_name(prefix, "limits_kv"), placement=placement)
    await ensure_object_store(js, js_name(prefix, "limits_obj"), placement=placement)
    for stream in (f"KV_{js_name(prefix, 'limits_kv')}", f"OBJ_{js_name(prefix, 'limits_obj')}"):
        info = await js.stream_info(stream)
        assert (info.config.max_bytes, info.config.num_replicas) == (4 << 20, 1)
