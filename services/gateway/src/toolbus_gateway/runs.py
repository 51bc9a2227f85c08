"""Which run an MCP request's calls belong to.

- A 2025-11-25 session is a run: one per session and toolset.
- A stateless (2026-07-28) client may name a run in the `Mcp-Run` header: that run is opened (or
  joined) for the caller's namespace and toolset (`runs.open` refuses a run of another user or
  toolset: `conflict`); the gateway never closes a named run, its owner does.
- Otherwise the run is bound to the credential (token or JWT subject) and toolset.

Runs the gateway chose itself are closed after `idle` seconds without a call (their unfinished
calls end `cancelled`); the next call opens a new one."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field

from toolbus_gateway.calls import Calls

log = logging.getLogger(__name__)


@dataclass
class _Bound:
    run_id: str
    last_used: float = field(default_factory=time.monotonic)
    in_flight: int = 0


class Runs:
    """The gateway's open runs (in this process: each replica binds its own)."""

    def __init__(self, calls: Calls, *, idle: float) -> None:
        self._calls = calls
        self._idle = idle
        self._bound: dict[tuple[str, str], _Bound] = {}
        self._opening: dict[tuple[str, str], asyncio.Future[_Bound]] = {}

    async def named(self, run_id: str, toolset_id: str, namespace: str) -> str:
        """Open or join the run the client named (no binding kept: the client owns it)."""
        return await self._calls.open_run(toolset_id, namespace, run_id)

    async def acquire(self, binding: str, toolset_id: str, namespace: str) -> str:
        """The run bound to `binding` for this toolset, opened on first use; `release` after the call."""
        key = (binding, toolset_id)
        bound = self._bound.get(key)
        if bound is None:
            pending = self._opening.get(key)
            if pending is None:
                pending = asyncio.get_running_loop().create_future()
                self._opening[key] = pending
                try:
                    run_id = await self._calls.open_run(toolset_id, namespace, f"run_{uuid.uuid4().hex}")
                    bound = self._bound[key] = _Bound(run_id)
                    pending.set_result(bound)
                except BaseException as exc:
                    pending.set_exception(exc)
                    pending.exception()  # retrieved: waiters re-raise it themselves
                    raise
                finally:
                    del self._opening[key]
            else:
                bound = await asyncio.shield(pending)
        bound.in_flight += 1
        bound.last_used = time.monotonic()
        return bound.run_id

    def release(self, binding: str, toolset_id: str) -> None:
        bound = self._bound.get((binding, toolset_id))
        if bound is not None:
            bound.in_flight -= 1
            bound.last_used = time.monotonic()

    def forget(self, binding: str, toolset_id: str, run_id: str) -> None:
        """Drop a binding whose run is gone (closed elsewhere): the next call opens a new one."""
        bound = self._bound.get((binding, toolset_id))
        if bound is not None and bound.run_id == run_id:
            del self._bound[(binding, toolset_id)]

    async def close_idle(self, *, now: float | None = None) -> int:
        """Close the runs idle for `idle` seconds (none with a call in flight); their number."""
        now = time.monotonic() if now is None else now
        idle = [k for k, b in self._bound.items() if b.in_flight == 0 and now - b.last_used >= self._idle]
        closed = 0
        for key in idle:
            bound = self._bound.pop(key)
            try:
                await self._calls.close_run(bound.run_id)
                closed += 1
            except Exception as exc:  # the dispatcher away: it closes on the next sweep
                self._bound.setdefault(key, bound)
                log.warning("idle run not closed", extra={"runId": bound.run_id, "error": type(exc).__name__})
        return closed

    async def close_all(self) -> None:
        for key in list(self._bound):
            bound = self._bound.pop(key)
            try:
                await self._calls.close_run(bound.run_id)
            except Exception as exc:
                log.warning("run not closed", extra={"runId": bound.run_id, "error": type(exc).__name__})
