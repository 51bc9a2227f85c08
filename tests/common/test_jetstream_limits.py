"""Streams and buckets take their limits from settings, and a deployment whose settings changed
brings an existing stream up to date (on the session's NATS, under the session's prefix)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from nats.js.api import StorageType
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


async def test_existing_buckets_follow_changed_settings(
    nc: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A deployment whose TOOLBUS_JS_MAX_BYTES changed brings its existing KV buckets and object
    stores to the new limit (and an object store with a TTL to the new TTL); a storage that differs
    from the settings is logged and left as it is; what was stored stays readable."""
    js = nc.jetstream()
    kv_name, obj_name = js_name(prefix, "follow_kv"), js_name(prefix, "follow_obj")
    kv_stream, obj_stream = f"KV_{kv_name}", f"OBJ_{obj_name}"
    first = JsPlacement(max_bytes=4 << 20)
    kv = await ensure_kv(js, kv_name, placement=first)
    await kv.put("k", b"v")
    store = await ensure_object_store(js, obj_name, placement=first, ttl=3600.0)
    await store.put("o", b"object")

    later = JsPlacement(max_bytes=8 << 20)
    kv = await ensure_kv(js, kv_name, placement=later)
    store = await ensure_object_store(js, obj_name, placement=later, ttl=7200.0)
    kv_config = (await js.stream_info(kv_stream)).config
    obj_config = (await js.stream_info(obj_stream)).config
    assert (kv_config.max_bytes, kv_config.num_replicas) == (8 << 20, 1)
    assert (obj_config.max_bytes, obj_config.max_age, obj_config.num_replicas) == (8 << 20, 7200, 1)
    assert (await kv.get("k")).value == b"v"
    assert (await store.get("o")).data == b"object"

    # No TTL given: an existing store keeps its own; unlimited again: -1.
    await ensure_object_store(js, obj_name)
    obj_config = (await js.stream_info(obj_stream)).config
    assert (obj_config.max_bytes, obj_config.max_age) == (-1, 7200)

    # Storage cannot change on a live stream: logged, the bucket keeps its file storage.
    with caplog.at_level("WARNING", logger="toolbus_common.connections"):
        await ensure_kv(js, kv_name, placement=JsPlacement(storage=StorageType.MEMORY, max_bytes=8 << 20))
    assert (await js.stream_info(kv_stream)).config.storage == StorageType.FILE
    assert any(
        r.getMessage() == "stream storage differs from settings" and getattr(r, "stream", "") == kv_stream
        for r in caplog.records
    )
