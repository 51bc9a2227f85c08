"""Backing-store outages are told apart from bugs: they become `unavailable`, never `internal`."""

from __future__ import annotations

import nats.errors
import pytest
import redis.exceptions
from toolbus_common.faults import is_backing_store_fault, unavailable
from toolbus_common.script_pipe import PipeConnectionError
from toolbus_contracts import ToolbusError
from toolbus_contracts.errors import ErrorCode, Unavailable


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.ConnectionError("Connection refused"),
        redis.exceptions.MaxConnectionsError("Too many connections"),  # type: ignore[attr-defined]  # redis>=5; stubs lag
        redis.exceptions.TimeoutError("Timeout reading from socket"),
        redis.exceptions.BusyLoadingError("loading"),
        # A master with min-replicas-to-write and too few replicas: redis-py has no class for it.
        redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."),
        PipeConnectionError("cannot reach Redis"),
        nats.errors.TimeoutError(),
        nats.errors.NoRespondersError(),
    ],
)
def test_backing_store_faults_are_unavailable(exc: Exception) -> None:
    assert is_backing_store_fault(exc)
    error = unavailable(exc)
    assert error.code is ErrorCode.UNAVAILABLE
    assert error.retryable
    assert str(exc) not in error.message or not str(exc)


def test_a_fault_raised_from_a_store_error_is_found_through_its_cause() -> None:
    outer = RuntimeError("wrapped")
    outer.__cause__ = redis.exceptions.ConnectionError("down")  # as `raise ... from inner` sets it
    assert is_backing_store_fault(outer)
    assert unavailable(outer).details == {"store": "Redis"}


@pytest.mark.parametrize("exc", [ValueError("bug"), KeyError("x"), redis.exceptions.ResponseError("ERR")])
def test_bugs_and_script_errors_are_not_outages(exc: Exception) -> None:
    assert not is_backing_store_fault(exc)


def test_unavailable_and_output_too_large_round_trip_on_the_wire() -> None:
    for code in ("unavailable", "outputTooLarge"):
        back = ToolbusError.from_wire({"code": code, "message": "m"})
        assert back.code.value == code
    assert isinstance(ToolbusError.from_wire({"code": "unavailable", "message": "m"}), Unavailable)
