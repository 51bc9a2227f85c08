"""The serving layer's Prometheus metrics: requests served and timed, commands handled, replies
that could not be sent as built."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram

REQUESTS = Counter(
    "toolbus_requests_total", "Requests served, by subject and result code", ["subject", "code"]
)
LATENCY = Histogram(
    "toolbus_request_seconds",
    "Time from receiving a request to sending its reply",
    ["subject"],
    buckets=(0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5, 10.0),
)
COMMANDS = Counter(
    "toolbus_commands_total",
    "Internal commands handled, by subject and result (applied, retried, deadLettered, refused)",
    ["subject", "result"],
)
REPLY_FAILURES = Counter(
    "toolbus_reply_failures_total", "Replies that could not be sent as built, by cause", ["cause"]
)

_COUNTED: dict[tuple[str, str], Any] = {}
_TIMED: dict[str, Any] = {}


def served(subject: str, code: str, seconds: float) -> None:
    """Count a request and time it: the labelled children are looked up once per subject and code
    (prometheus_client's `labels()` takes a lock and builds the key on every call)."""
    counter = _COUNTED.get((subject, code))
    if counter is None:
        counter = _COUNTED[(subject, code)] = REQUESTS.labels(subject, code)
    timer = _TIMED.get(subject)
    if timer is None:
        timer = _TIMED[subject] = LATENCY.labels(subject)
    counter.inc()
    timer.observe(seconds)
