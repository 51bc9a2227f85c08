"""A host-tool worker as its own process, for the SIGTERM test: `python -m tests.sdk.worker_app`.

Serves `slow.work(seconds, tag)`: publishes `<prefix>.test.started` with the tag once it runs,
sleeps, and returns `{"tag", "attempt", "idempotencyKey"}`. Prints `ready` once subscribed and
`stopped <handed back>` when it has shut down."""

from __future__ import annotations

import asyncio
import sys

from toolbus import CallContext, Toolbus, Worker, host_tool


@host_tool(name="slow.work", policy={"heartbeatTimeout": "1s"})
async def slow_work(seconds: float, tag: str, ctx: CallContext) -> dict[str, object]:
    """Sleep a while, then say which attempt ran."""
    await TB.nc.publish(f"{TB.prefix}.test.started", tag.encode())
    await asyncio.sleep(seconds)
    return {"tag": tag, "attempt": ctx.attempt, "idempotencyKey": ctx.idempotency_key}


TB: Toolbus


async def main() -> None:
    global TB
    TB = await Toolbus.connect()
    worker = Worker(TB, tools=[slow_work], concurrency=4, grace=30)
    serving = asyncio.create_task(worker.run())  # SIGTERM / SIGINT stop it
    await worker.ready.wait()
    print("ready", flush=True)
    handed_back = await serving
    print(f"stopped {handed_back} completed={worker.completed}", flush=True)
    await TB.close()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
