"""`free_port` picks below the kernel's ephemeral range, so a server started on it cannot lose it
to an outgoing connection's local port; where that range is unknown it asks the OS."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest
from toolbus_devstack import processes
from toolbus_devstack.processes import LOWEST_PICKED, free_port


def test_the_port_is_below_the_ephemeral_range_and_bindable() -> None:
    start = processes._ephemeral_start()
    if start is None or start - LOWEST_PICKED < 1000:
        pytest.skip("no ephemeral range to stay below on this machine")
    for _ in range(20):
        port = free_port()
        assert LOWEST_PICKED <= port < start
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_taken_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        # The taken port twice, then real picks: a fixed third one (busy + 1) could be taken too.
        picks = iter([busy, busy])
        real = random.randrange
        monkeypatch.setattr(processes, "_ephemeral_start", lambda: LOWEST_PICKED + 5000)
        monkeypatch.setattr(random, "randrange", lambda a, b: next(picks, None) or real(a, b))
        assert free_port() != busy


def test_without_the_range_the_os_picks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(processes, "EPHEMERAL_RANGE", tmp_path / "absent")
    assert processes._ephemeral_start() is None
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
