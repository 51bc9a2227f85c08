"""`make up` where another program listens on the gateway's MCP port (`TOOLBUS_GATEWAY_PORT`):
the gateway moves to a free port, says so, and prints the MCP URL it really serves."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.devstack.test_infra_stack import _own_servers_env, _stack
from tests.support.infra import free_port, http_status

pytestmark = pytest.mark.integration


def test_a_taken_mcp_port_moves_the_gateway_to_a_free_one_and_prints_its_url(tmp_path: Path) -> None:
    health_port = free_port()
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        held = other.getsockname()[1]
        env = _own_servers_env(tmp_path, held) | {"TOOLBUS_GATEWAY_PORT": str(held)}
        try:
            up = _stack(env, "up", "--services", "gateway", "--port-base", str(health_port - 4))
            assert up.returncode == 0, up.stdout + up.stderr
            assert "Traceback" not in up.stderr
            note = re.search(
                rf"note: gateway MCP: port {held} is taken by another program, so it listens on (\d+)",
                up.stderr,
            )
            assert note is not None, up.stderr
            port = int(note.group(1))
            assert port != held
            assert f"MCP: http://127.0.0.1:{port}/mcp/<toolsetId>" in up.stdout
            assert http_status(f"http://127.0.0.1:{port}/mcp/ts_{'a' * 64}") == 401
            again = _stack(env, "up", "--services", "gateway", "--json")  # already running: same URL
            summary = json.loads(again.stdout)
            assert summary["services"]["gateway"]["mcp"] == f"http://127.0.0.1:{port}/mcp/<toolsetId>"
        finally:
            down = _stack(env, "down")
        assert down.returncode == 0, down.stdout + down.stderr


def test_the_gateway_on_a_taken_port_says_so_in_one_line(tmp_path: Path) -> None:
    """Run by hand (not by `make up`) on a port another program holds: one error line, no trace."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        held = other.getsockname()[1]
        env = _own_servers_env(tmp_path, held) | {"TOOLBUS_GATEWAY_PORT": str(held), "TOOLBUS_HTTP_PORT": "0"}
        done = subprocess.run(
            [sys.executable, "-m", "toolbus_gateway"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert (
        f"error: the gateway's MCP port 127.0.0.1:{held} (TOOLBUS_GATEWAY_PORT) cannot be bound"
        in done.stderr
    )
