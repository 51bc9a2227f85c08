"""The dispatcher's Redis semaphore, acquired and released as a call does it: `CallStore.create_call`
(idempotency check, store the call, take a run slot: `create_call.lua`) then `CallStore.finish`
(store the outcome, free the slot, admit waiting calls: `finish_call.lua`), on the dispatcher's own
`ScriptPipe`, against two round trips of an empty script on the same pipe (the floor).

`ScriptStack` builds the store over any object with the pipe's `evalsha(sha, keys, args)`, so
`bench/alternatives.py` runs the very same scripts with the very same keys through other clients.

    uv run python bench/semaphore.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from toolbus_common.clock import now_iso
from toolbus_common.keys import Keys
from toolbus_common.script_pipe import ScriptPipe
from toolbus_contracts import Subjects
from toolbus_dispatcher.store import CallStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Figure, Row, in_flight, latency_figures, merge, print_table, sequential
from tests.support.infra import unique_prefix

SECTION = "Redis semaphore"
REDIS_URL = os.environ.get("TOOLBUS_REDIS_URL", "redis://127.0.0.1:6379/0")
EMPTY = "return 1"
EMPTY_SHA = hashlib.sha1(EMPTY.encode()).hexdigest()


class ScriptStack:
    """A `CallStore` of a fresh prefix over `pipe`, with one open run; `acquire_release()` is one
    call's two hot-path scripts, `floor()` two empty-script round trips on the same pipe."""

    def __init__(self, pipe: Any, redis: Redis[bytes]) -> None:
        self.prefix = unique_prefix("tbbench")
        self.redis = redis
        self.pipe = pipe
        events_prefix = Subjects(self.prefix).call_events("", "")[:-1]  # as the dispatcher's app does
        self.store = CallStore(
            redis,
            Keys(self.prefix),
            "d_bench",
            lease=60.0,
            pipe=pipe,
            events_prefix=events_prefix,
            runs_closed_subject=Subjects(self.prefix).internal_runs_closed,
        )
        self.run_id = f"run_{uuid.uuid4().hex}"

    async def open(self) -> ScriptStack:
        await self.store.load_scripts()
        await self.redis.script_load(EMPTY)  # type: ignore[no-untyped-call]  # types-redis 4.6 leaves it unannotated
        status = await self.store.open_run(self.run_id, "ts_" + "0" * 64, None, now_iso())
        assert status == "opened", status
        return self

    async def acquire_release(self) -> object:
        call_id = f"call_{uuid.uuid4().hex}"
        created = await self.store.create_call(
            call_id=call_id,
            run_id=self.run_id,
            idempotency_key=uuid.uuid4().hex,
            tool="echo.echo",
            input_json='{"text":"hi"}',
            toolset_id="ts_" + "0" * 64,
            namespace=None,
            concurrency=None,
            on_interruption="retry",
            reply="_INBOX.bench",
            now=now_iso(),
            approval_id="",
            digest="",
        )
        assert created.status == "created", created
        assert created.admitted, created
        finished = await self.store.finish(call_id, '{"status":"ok","output":{}}', now_iso())
        assert finished.status == "done", finished
        return finished

    async def floor(self) -> object:
        await self.pipe.evalsha(EMPTY_SHA, [], [])
        return await self.pipe.evalsha(EMPTY_SHA, [], [])

    async def close(self) -> None:
        keys = [k async for k in self.redis.scan_iter(match=f"{self.prefix}:*", count=1000)]
        for i in range(0, len(keys), 1000):
            await self.redis.unlink(*keys[i : i + 1000])


async def measure(calls: int) -> list[Figure]:
    redis: Redis[bytes] = Redis.from_url(REDIS_URL)
    pipe = ScriptPipe(REDIS_URL)
    stack = await ScriptStack(pipe, redis).open()
    try:
        for fn in (stack.floor, stack.acquire_release):
            await sequential(fn, min(calls, 200))
        got: dict[tuple[str, str], list[Row]] = {}
        for _ in range(2):
            for name, fn in (("floor", stack.floor), ("sem", stack.acquire_release)):
                got.setdefault((name, "seq"), []).append(await sequential(fn, calls))
                got.setdefault((name, "x16"), []).append(await in_flight(fn, calls))
        base = "2 empty EVALSHA round trips"
        return [
            *latency_figures(
                SECTION,
                "create_call + finish, sequential:",
                merge(got[("sem", "seq")]),
                base,
                merge(got[("floor", "seq")]),
            ),
            *latency_figures(
                SECTION,
                "create_call + finish, 16 in flight:",
                merge(got[("sem", "x16")]),
                base,
                merge(got[("floor", "x16")]),
            ),
        ]
    finally:
        await stack.close()
        await pipe.aclose()
        await redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag


async def main(calls: int) -> None:
    print_table(await measure(calls), f"{calls} acquire + release per row, 2 rounds")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    import uvloop

    uvloop.run(main(parser.parse_args().calls))
