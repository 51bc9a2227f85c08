"""Call outcomes as wire dicts, and the policy decisions about interrupted attempts."""

from __future__ import annotations

from typing import Any

from toolbus_contracts.registry import MAX_ATTEMPTS

from toolbus_dispatcher.executors.base import Interrupted


def ok(output: Any) -> dict[str, Any]:
    return {"status": "ok", "output": output}


MAX_MESSAGE = 4000
"""An error outcome's message is cut here, so an error outcome always travels inline."""


def failed(code: str, message: str) -> dict[str, Any]:
    return {"status": "error", "error": {"code": code, "message": message[:MAX_MESSAGE]}}


def after_interruption(
    interrupted: Interrupted, *, attempt: int, on_interruption: str, max_attempts: int = MAX_ATTEMPTS
) -> dict[str, Any] | None:
    """The outcome an interrupted attempt ends the call with, or None to send it again.

    `at_most_once` ends with `outcomeUnknown` unless the request provably never left; `retry`
    sends again until `max_attempts` attempts in all, then ends with the last error.
    """
    if interrupted.sent and on_interruption == "at_most_once":
        return failed(
            "outcomeUnknown",
            f"The call was interrupted and may or may not have run ({interrupted.error.message}); "
            "its policy is at_most_once, so it was not sent again.",
        )
    if attempt >= max_attempts:
        return failed(interrupted.error.code.value, interrupted.error.message)
    return None


def backoff(attempt: int, base: float, cap: float) -> float:
    """Pause before attempt `attempt + 1`: base, 2*base, 4*base... capped."""
    return float(min(cap, base * 2.0 ** max(0, attempt - 1)))
