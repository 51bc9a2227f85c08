"""The relay's publishing round (`toolbus_common.outbox._Round`): its future completes once
every entry sent has its answer, whether the acks come while the round is still being published
or after, and an entry never answered stays failed."""

from __future__ import annotations

import asyncio

from toolbus_common.outbox import _Round


async def test_acks_during_publishing_complete_the_round_only_when_it_is_sent() -> None:
    r = _Round(3, asyncio.get_running_loop().create_future())
    for i in range(3):
        r.pending += 1
        r.answer(i, i != 1)  # each ack comes before the next publish
        assert not r.done.done()
    r.sent()
    assert r.done.done() and r.results == [True, False, True]


async def test_acks_after_publishing_complete_the_round_with_the_last() -> None:
    r = _Round(2, asyncio.get_running_loop().create_future())
    r.pending = 2
    r.sent()
    r.answer(1, True)
    assert not r.done.done()
    r.answer(0, True)
    assert r.done.done() and r.results == [True, True]


async def test_an_entry_not_sent_or_not_answered_is_failed() -> None:
    r = _Round(3, asyncio.get_running_loop().create_future())
    r.pending = 2  # the third publish failed: never sent
    r.sent()
    r.answer(0, True)
    assert not r.done.done()  # the second's ack never comes: the relay's wait times out
    assert r.results == [True, False, False]
