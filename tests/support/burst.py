"""A harness's burst of calls that rides out failures: each call is `calls.start`ed until it is
acknowledged (its callId), then `calls.invoke`d with the same idempotency key until it has an
outcome. `unavailable` replies and request timeouts are retried with the same key, so a call is
never created twice; a call whose acknowledged callId is not the one the invoke finds was lost.

Used by the cluster and Sentinel tests; `BurstReport` holds the figures they print.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import nats.errors


@dataclass
class BurstReport:
    sent: int = 0
    acknowledged: dict[str, str] = field(default_factory=dict)
    """idempotency key -> callId of the `calls.start` acknowledgement."""
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    invoked_ids: dict[str, str] = field(default_factory=dict)
    retried_unavailable: int = 0
    retried_timeout: int = 0
    other_errors: list[str] = field(default_factory=list)
    ack_times: dict[str, float] = field(default_factory=dict)
    """idempotency key -> monotonic time of its acknowledgement."""
    done_times: dict[str, float] = field(default_factory=dict)
    """idempotency key -> monotonic time its outcome arrived."""
    failure_times: list[float] = field(default_factory=list)
    """Monotonic times of the `unavailable` replies and timeouts (retried)."""

    @property
    def lost(self) -> list[str]:
        """Keys acknowledged with one callId whose invoke found another (or none)."""
        return [k for k, cid in self.acknowledged.items() if self.invoked_ids.get(k) != cid]

    def statuses(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.outcomes.values():
            status = outcome["status"] if outcome["status"] == "ok" else outcome["error"]["code"]
            counts[status] = counts.get(status, 0) + 1
        return counts

    def in_flight_done_after(self, moment: float) -> float:
        """Seconds from `moment` until the last call acknowledged before it had its outcome: how
        long the calls caught in flight by a fault took to finish."""
        caught = [
            self.done_times[k] for k, t in self.ack_times.items() if t < moment and k in self.done_times
        ]
        return max((t - moment for t in caught if t >= moment), default=0.0)

    def recovered_after(self, moment: float) -> float:
        """Seconds from `moment` (the fault) to the last failed request after it: how long
        requests failed before everything was answered again (0.0 when none failed)."""
        later = [t for t in self.failure_times if t >= moment]
        return max(later) - moment if later else 0.0


async def _until_ok(
    nc: Any, subject: str, body: dict[str, Any], report: BurstReport, *, timeout: float, deadline: float
) -> dict[str, Any]:
    data = json.dumps(body).encode()
    while True:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no answer for {body.get('idempotencyKey')} on {subject} before the deadline"
            )
        try:
            msg = await nc.request(subject, data, timeout=timeout)
        except (
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            nats.errors.ConnectionReconnectingError,
        ):
            report.retried_timeout += 1
            report.failure_times.append(time.monotonic())
            await asyncio.sleep(0.1)
            continue
        reply = json.loads(msg.data)
        if reply.get("ok"):
            result: dict[str, Any] = reply["data"]
            return result
        code = reply["error"]["code"]
        if code == "unavailable":
            report.retried_unavailable += 1
            report.failure_times.append(time.monotonic())
            await asyncio.sleep(0.1)
            continue
        report.other_errors.append(f"{subject}: {code}: {reply['error']['message']}")
        raise AssertionError(f"{subject} answered {code}: {reply['error']['message']}")


async def run_burst(
    nc: Any,
    prefix: str,
    run_id: str,
    tool: str,
    n: int,
    *,
    concurrency: int = 16,
    key_prefix: str = "burst",
    limit: float = 150.0,
    on_ack: Any = None,
) -> BurstReport:
    """`n` calls of `tool` (input `{"text": key}`) in `run_id`, `concurrency` at a time."""
    report = BurstReport(sent=n)
    deadline = time.monotonic() + limit
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        key = f"{key_prefix}-{i}"
        body = {"runId": run_id, "tool": tool, "input": {"text": key}, "idempotencyKey": key}
        async with gate:
            started = await _until_ok(nc, f"{prefix}.calls.start", body, report, timeout=5, deadline=deadline)
            report.acknowledged[key] = started["callId"]
            report.ack_times[key] = time.monotonic()
            if on_ack is not None:
                on_ack(len(report.acknowledged))
            done = await _until_ok(nc, f"{prefix}.calls.invoke", body, report, timeout=10, deadline=deadline)
            report.invoked_ids[key] = done["callId"]
            report.outcomes[key] = done["outcome"]
            report.done_times[key] = time.monotonic()

    await asyncio.gather(*(one(i) for i in range(n)))
    return report
