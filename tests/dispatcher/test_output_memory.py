"""`OutputMemory`: the bound on large outputs in flight is never passed, a reservation past it
waits first come first served, a cancelled waiter gives its turn back, and a lease released while
it waited holds nothing after."""

from __future__ import annotations

import asyncio

from toolbus_dispatcher.output_memory import COST, OutputMemory


async def test_a_reservation_past_the_bound_waits_until_another_is_released() -> None:
    memory = OutputMemory(100)
    first, second = memory.lease(), memory.lease()
    await first.reserve(int(60 / COST))
    waiting = asyncio.create_task(second.reserve(int(60 / COST)))
    await asyncio.sleep(0.01)
    assert not waiting.done() and memory.used == 60 and memory.waits == 1
    first.release()
    await asyncio.wait_for(waiting, 1)
    assert memory.used == 60 and memory.peak == 60
    second.release()
    assert memory.used == 0


async def test_waiters_are_served_first_come_first_served() -> None:
    memory = OutputMemory(100)
    holder = memory.lease()
    await holder.reserve(50)  # all of it
    order: list[str] = []

    async def take(name: str, size: int) -> None:
        lease = memory.lease()
        await lease.reserve(size)
        order.append(name)
        lease.release()

    big = asyncio.create_task(take("big", 40))
    await asyncio.sleep(0)
    small = asyncio.create_task(take("small", 5))
    await asyncio.sleep(0.01)
    assert order == []  # the small one does not overtake the big one ahead of it
    holder.release()
    await asyncio.wait_for(asyncio.gather(big, small), 1)
    assert order == ["big", "small"] and memory.used == 0


async def test_an_answer_larger_than_the_bound_takes_all_of_it_and_runs_alone() -> None:
    memory = OutputMemory(100)
    lease = memory.lease()
    await lease.reserve(10_000)
    assert memory.used == 100
    lease.release()
    assert memory.used == 0


async def test_a_cancelled_waiter_gives_its_turn_to_the_next() -> None:
    memory = OutputMemory(int(100 * COST))
    holder = memory.lease()
    await holder.reserve(80)
    blocked = asyncio.create_task(memory.lease().reserve(80))  # 80 more: waits
    await asyncio.sleep(0)
    fits = asyncio.create_task(memory.lease().reserve(10))  # 10 more: fits, but queued behind
    await asyncio.sleep(0.01)
    assert not fits.done()
    blocked.cancel()
    await asyncio.wait_for(fits, 1)
    assert memory.used == memory.cost(80) + memory.cost(10)


async def test_a_lease_released_while_it_waited_holds_nothing_after() -> None:
    memory = OutputMemory(100)
    holder = memory.lease()
    await holder.reserve(50)
    late = memory.lease()
    waiting = asyncio.create_task(late.reserve(50))
    await asyncio.sleep(0.01)
    late.release()  # the call ended (timed out) while its reservation waited
    holder.release()
    await asyncio.wait_for(waiting, 1)
    assert memory.used == 0
