"""The SDK's retry loop after `unavailable` (`toolbus._retry`), on a fake clock: the backoff
schedule, the deadline, what is and is not sent again. No sleeping for real."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from toolbus import Backoff, Conflict, Timeout, Unavailable
from toolbus._retry import until_deadline


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def sender(clock: Clock, answers: list[Any]) -> tuple[Callable[[float, bool], Any], list[tuple[float, bool]]]:
    """`send` answering `answers` in turn (an exception is raised), recording (left, retried)."""
    seen: list[tuple[float, bool]] = []

    async def send(left: float, retried: bool) -> Any:
        seen.append((left, retried))
        clock.now += min(0.01, left)  # each attempt takes a little time, never past its `left`
        answer = answers.pop(0) if answers else Unavailable(f"down #{len(seen)}")
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return send, seen


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_schedule_doubles_from_a_tenth_of_a_second_to_two_with_jitter_in_the_upper_half() -> None:
    def take(rand: float, n: int = 8) -> list[float]:
        it = Backoff().delays(lambda: rand)
        return [round(next(it), 6) for _ in range(n)]

    assert take(0.0) == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert take(0.999999) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0], abs=1e-5)
    assert [round(next(Backoff(first=1, factor=3, cap=5).delays(lambda: 0.5)), 3)] == [0.75]


def test_unavailable_is_sent_again_until_it_succeeds() -> None:
    clock = Clock()
    send, seen = sender(clock, [Unavailable("a"), Unavailable("b"), {"ok": 1}])
    got = run(until_deadline(send, 10.0, Backoff(), clock=clock, sleep=clock.sleep, rand=lambda: 0.0))
    assert got == {"ok": 1}
    assert [r for _, r in seen] == [False, True, True]
    assert clock.slept == [0.05, 0.1]
    assert seen[0][0] == 10.0 and seen[1][0] < seen[0][0] and seen[2][0] < seen[1][0]


def test_the_last_unavailable_is_raised_once_the_timeout_is_spent() -> None:
    clock = Clock()
    send, seen = sender(clock, [])
    with pytest.raises(Unavailable) as info:
        run(until_deadline(send, 3.0, Backoff(), clock=clock, sleep=clock.sleep, rand=lambda: 0.999))
    assert info.value.message == f"down #{len(seen)}"  # the last one, not the first
    assert clock.now - 100.0 <= 3.0  # never waits past the deadline
    assert len(seen) >= 4 and all(left > 0 for left, _ in seen)


def test_a_non_retryable_unavailable_is_raised_at_once() -> None:
    clock = Clock()
    send, seen = sender(clock, [Unavailable("refused credentials", retryable=False), {"ok": 1}])
    with pytest.raises(Unavailable, match="refused credentials"):
        run(until_deadline(send, 10.0, Backoff(), clock=clock, sleep=clock.sleep))
    assert len(seen) == 1 and clock.slept == []


@pytest.mark.parametrize("error", [Conflict("second decision"), Timeout("no reply")])
def test_other_errors_are_not_sent_again(error: Exception) -> None:
    clock = Clock()
    send, seen = sender(clock, [error, {"ok": 1}])
    with pytest.raises(type(error)):
        run(until_deadline(send, 10.0, Backoff(), clock=clock, sleep=clock.sleep))
    assert len(seen) == 1


def test_retries_off_is_one_attempt() -> None:
    clock = Clock()
    send, seen = sender(clock, [Unavailable("down"), {"ok": 1}])
    with pytest.raises(Unavailable):
        run(until_deadline(send, 10.0, None, clock=clock, sleep=clock.sleep))
    assert len(seen) == 1


def _decide_with(answers: list[Any], **decide: Any) -> tuple[Any, list[str]]:
    """`tb.approvals.decide` through `Toolbus.request`, its sends answered by `answers` in turn."""
    from toolbus import Toolbus

    tb = Toolbus(None, "tbunit", timeout=10, backoff=Backoff(first=0.001, cap=0.001))  # type: ignore[arg-type]
    sent: list[str] = []

    async def send(subject: str, payload: bytes, wait: float) -> Any:
        sent.append(subject)
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    tb._send = send  # type: ignore[method-assign]
    try:
        return run(tb.approvals.decide("apr_1", **decide)), sent
    except Exception as exc:
        return exc, sent


def test_a_decide_retried_after_unavailable_that_meets_its_own_decision_is_that_decision() -> None:
    lost = Unavailable("Redis did not answer in time")
    mine = Conflict("already approved", details={"state": "approved"})
    got, sent = _decide_with([lost, mine], approve=True)
    assert got == "approved" and sent == ["tbunit.approvals.decide"] * 2
    with_reason = Conflict("already denied", details={"state": "denied", "reason": "no"})
    assert _decide_with([lost, with_reason], approve=False, reason="no")[0] == "denied"


def test_a_decide_conflict_that_is_not_its_own_decision_is_raised() -> None:
    lost = Unavailable("Redis did not answer in time")
    other = Conflict("already denied", details={"state": "denied", "reason": "no"})
    assert isinstance(_decide_with([lost, other], approve=True)[0], Conflict)
    assert isinstance(_decide_with([lost, other], approve=False, reason="other")[0], Conflict)
    # Without an `unavailable` before it, a conflict is a second decision, even an identical one.
    same = Conflict("already approved", details={"state": "approved"})
    assert isinstance(_decide_with([same], approve=True)[0], Conflict)


def test_no_service_at_all_is_sent_again_for_a_few_seconds_not_the_whole_timeout() -> None:
    """No subscriber (`noService`): sent again for `NO_SERVICE_WAIT` seconds (a restarting service
    is back by then), then raised, so a stack that is not running is told in seconds; a store
    that is down is waited out until the timeout."""
    from toolbus._core import NO_SERVICE_WAIT, _no_service_for_long

    # (details, the least and the most time spent before the last Unavailable is raised)
    cases = (({"noService": True}, NO_SERVICE_WAIT, NO_SERVICE_WAIT + 2.5), ({"store": "Redis"}, 28.0, 30.0))
    for details, least, most in cases:
        clock = Clock()
        send, seen = sender(clock, [Unavailable("down", details=details) for _ in range(100)])
        with pytest.raises(Unavailable):
            asyncio.run(
                until_deadline(
                    send, 30.0, Backoff(), give_up=_no_service_for_long, clock=clock, sleep=clock.sleep
                )
            )
        spent = clock.now - 100.0
        assert least <= spent <= most, (details, spent, len(seen))
