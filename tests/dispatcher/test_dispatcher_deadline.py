"""`within` (the attempt's timer) behaves as `asyncio.timeout` for one await, and the credentials
memo answers from memory only at the version it was filled at."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from toolbus_dispatcher.credentials import StoreCredentials
from toolbus_dispatcher.deadline import within


async def test_within_returns_the_result_in_time() -> None:
    loop = asyncio.get_running_loop()
    assert await within(loop, 5.0, asyncio.sleep(0, "done")) == "done"


async def test_within_raises_timeout_error_when_the_time_is_up() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        await within(loop, 0.01, asyncio.sleep(5))
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the timer's cancellation was taken back


async def test_a_swallowed_timeout_leaves_the_task_not_cancelling() -> None:
    """As `asyncio.timeout` does: when the awaited code swallows the timer's cancellation and
    returns, the cancellation is taken back all the same (a later TaskGroup or timeout in the
    task would otherwise see it as being cancelled)."""
    loop = asyncio.get_running_loop()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "kept going"
        return "slept"

    assert await within(loop, 0.01, stubborn()) == "kept going"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    loop = asyncio.get_running_loop()
    inner = asyncio.ensure_future(within(loop, 5.0, asyncio.sleep(5)))
    await asyncio.sleep(0.01)
    inner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await inner


async def test_an_error_inside_passes_through_and_the_timer_is_gone() -> None:
    loop = asyncio.get_running_loop()

    async def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await within(loop, 0.05, fail())
    await asyncio.sleep(0.1)  # the timer, had it stayed armed, would cancel this sleep


class _Resolved:
    def __init__(self, headers: dict[str, str], level: str) -> None:
        self.headers, self.level = headers, level


class _Store:
    def __init__(self) -> None:
        self.reads: list[int | None] = []
        self.token = "a"

    async def resolve(self, *, version: int | None = None, **_: Any) -> _Resolved:
        self.reads.append(version)
        return _Resolved({"Authorization": f"Bearer {self.token}"}, "toolset")


async def test_credentials_memo_is_dropped_when_the_version_moves() -> None:
    store = _Store()
    creds = StoreCredentials(store)  # type: ignore[arg-type]
    first = await creds.resolve("ts", None, "run", "srv")
    assert await creds.resolve("ts", None, "run", "srv") == first
    assert store.reads == [0]  # the second came from memory
    store.token = "b"
    creds.observe_version("3")
    headers, level = await creds.resolve("ts", None, "run", "srv")
    assert headers == {"Authorization": "Bearer b"} and level == "toolset"
    assert store.reads == [0, 3]
    await creds.resolve("ts", None, "other-run", "srv")
    assert store.reads == [0, 3, 3]  # another run: its own entry
