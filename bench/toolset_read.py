"""What checking a stored toolset against its content address costs on a read (issue 32): a
1,000-tool toolset (~1 MB) read from a JetStream object store by a store with nothing cached, as
a dispatcher, registry or credentials service does on a toolset's first use:

- unchecked: the object fetched and parsed (`ToolsetStore.get` before the check, the baseline);
- checked: `ToolsetStore.get` as it is (fetch, SHA-256 of the bytes against the id, parse);
- the check alone: one SHA-256 of the stored bytes; and `toolsets.verified` (parse and check) on
  bytes in memory, for the stored canonical JSON and for a copy stored in another form (parsed,
  then its canonical JSON hashed: the registry stores that form only when JCS cannot write an
  integer exactly).

Checked and unchecked reads alternated, medians of `--samples`; a bucket of its own on the local NATS, deleted at the end.

    uv run python bench/toolset_read.py [--samples 30] [--tools 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

import nats
from toolbus_common.canonical import canonical_json, content_id
from toolbus_common.toolsets import ToolsetStore, verified
from toolbus_contracts import PinnedToolset

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.infra import js_name, unique_prefix
from tests.support.mcp_servers import synthetic_tools

NATS_URL = os.environ.get("TOOLBUS_NATS_URL", "nats://127.0.0.1:4222")


def ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:8.2f} ms"


async def main(samples: int, tools: int) -> None:
    pinned = PinnedToolset.model_validate(
        {"servers": [{"name": "big", "url": "http://127.0.0.1:1/mcp", "tools": synthetic_tools(tools)}]}
    )
    canonical = canonical_json(pinned.wire())
    tid = content_id("ts_", pinned.wire())
    other_form = pinned.wire_json()
    nc = await nats.connect(NATS_URL)
    bucket = js_name(unique_prefix("tbbench"), "toolsets")
    try:
        writer = ToolsetStore(nc.jetstream(), bucket, chunk_bytes=nc.max_payload)
        await writer.open()
        await writer.save(writer.entry(tid, pinned), lambda: canonical)
        obj = nc.jetstream()
        times: dict[str, list[float]] = {k: [] for k in ("unchecked", "checked", "sha", "hash", "reparse")}
        for i in range(samples):
            for kind in ("unchecked", "checked") if i % 2 else ("checked", "unchecked"):
                reader = ToolsetStore(obj, bucket)
                await reader.open()
                t = time.perf_counter()
                if kind == "checked":
                    assert await reader.get(tid) is not None
                else:
                    raw = await reader._obj.get(tid)
                    PinnedToolset.model_validate_json(raw.data or b"")
                times[kind].append(time.perf_counter() - t)

            t = time.perf_counter()
            hashlib.sha256(canonical).hexdigest()
            times["sha"].append(time.perf_counter() - t)

            t = time.perf_counter()
            verified(tid, canonical)
            times["hash"].append(time.perf_counter() - t)
            t = time.perf_counter()
            verified(tid, other_form)
            times["reparse"].append(time.perf_counter() - t)
        t = time.perf_counter()
        PinnedToolset.model_validate_json(canonical)
        parse_once = time.perf_counter() - t
    finally:
        await nc.jetstream().delete_stream("OBJ_" + bucket)
        await nc.close()
    print(f"toolset read, {tools} tools, {len(canonical) / 1e6:.2f} MB stored, median of {samples}:")
    print(f"  read without the check (fetch + parse, baseline) {ms(times['unchecked'])}")
    print(f"  read with the check (ToolsetStore.get)            {ms(times['checked'])}")
    print(f"  the check itself: SHA-256 of the stored bytes     {ms(times['sha'])}")
    print(f"  verified() in memory, canonical copy (parse+hash) {ms(times['hash'])}")
    print(f"  verified() in memory, other form (parse+JCS+hash) {ms(times['reparse'])}")
    print(f"  (one parse alone, for scale: {parse_once * 1000:.2f} ms)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--tools", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(main(args.samples, args.tools))
