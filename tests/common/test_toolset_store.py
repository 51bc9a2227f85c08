"""The toolset store on a real JetStream: a toolset stored already is not written again by a store
that has not cached it (another replica, a restarted registry), and a small toolset is not put
through a buffer of the whole chunk size."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import nats
import pytest
from toolbus_common.canonical import content_id
from toolbus_common.toolsets import MAX_CHUNK_BYTES, ToolsetStore
from toolbus_contracts import PinnedToolset

from tests.dispatcher.test_dispatcher_helpers import host_tool
from tests.support.infra import js_name, unique_prefix

pytestmark = pytest.mark.integration


class _CountingPuts:
    """Wraps an object store's `put`, keeping each call's chunk size."""

    def __init__(self, store: ToolsetStore) -> None:
        obj = store._obj
        self.chunks: list[int] = []
        real = obj.put

        async def put(name: str, data: str | bytes | io.BufferedIOBase, meta: Any = None, **kw: Any) -> Any:
            self.chunks.append(meta.options.max_chunk_size)
            return await real(name, data, meta=meta, **kw)

        obj.put = put  # type: ignore[method-assign]


async def test_a_stored_toolset_is_not_written_again_and_small_ones_use_small_chunks(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    bucket = js_name(unique_prefix("tbstore"), "toolsets")
    try:
        pinned = PinnedToolset.model_validate({"host": [host_tool("one"), host_tool("two")]})
        tid = content_id("ts_", pinned.model_dump(mode="json", exclude_none=True))
        first = ToolsetStore(nc.jetstream(), bucket, chunk_bytes=64 * MAX_CHUNK_BYTES)
        await first.open()
        puts = _CountingPuts(first)
        await first.put(tid, pinned)
        size = len(pinned.wire_json())
        assert puts.chunks == [size]  # the chunk is the data's size, not the connection's max

        second = ToolsetStore(nc.jetstream(), bucket)  # a fresh cache: another replica
        await second.open()
        again = _CountingPuts(second)
        await second.put(tid, pinned)
        assert again.chunks == []  # asked whether it is stored, not written again
        encoded: list[bytes] = []

        def encode() -> bytes:
            encoded.append(pinned.wire_json())
            return encoded[-1]

        fresh = ToolsetStore(nc.jetstream(), bucket)  # stored already, not cached here
        await fresh.open()
        await fresh.save(fresh.entry(tid, pinned), encode)
        await fresh.save(fresh.entry(tid, pinned), encode)  # and now cached
        assert encoded == []  # the caller's encoding is not done for a toolset stored already
        third = ToolsetStore(nc.jetstream(), bucket)
        await third.open()
        read = await third.get(tid)
        assert read is not None and read.pinned == pinned
    finally:
        with contextlib.suppress(Exception):
            await nc.jetstream().delete_stream("OBJ_" + bucket)
        await nc.drain()
