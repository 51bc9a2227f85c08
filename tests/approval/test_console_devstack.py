"""`make up` serves the approvals console: it prints the console's URL and a development token
made for that stack (kept private in the stack directory, the same on the next `up`), and that
token signs in; a wrong one does not. Where another program holds the console's port, the console
listens on another, and `up` says so and prints that URL; `status` shows the console's and the
gateway's MCP URLs."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.approval.conftest import csrf_of
from tests.support.infra import free_port

pytestmark = pytest.mark.integration

STACK_PY = Path(__file__).resolve().parents[2] / "scripts" / "stack.py"


def _stack(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(STACK_PY), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _sign_in(url: str, token: str) -> int:
    with httpx.Client(base_url=url, follow_redirects=False, timeout=10) as browser:
        csrf = csrf_of(browser.get("/login").text)
        answer = browser.post("/login/dev", data={"csrf": csrf, "token": token})
        if answer.status_code != 303:
            return answer.status_code
        return browser.get("/").status_code


def test_up_prints_the_console_url_and_a_development_token_that_signs_in(tmp_path: Path) -> None:
    health, console = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLBUS_")}
    env |= {
        "TOOLBUS_STACK_DIR": str(tmp_path / "stack"),
        "TOOLBUS_NATS_URL": f"nats://127.0.0.1:{free_port()}",
        "TOOLBUS_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "TOOLBUS_SUBJECT_PREFIX": f"tbtstackcn{health}",
        "TOOLBUS_CONSOLE_PORT": str(console),
    }
    try:
        up = _stack(env, "up", "--services", "approval", "--port-base", str(health - 2))
        assert up.returncode == 0, up.stdout + up.stderr
        found = re.search(r"console: (http://127\.0\.0\.1:\d+)/ \(development token: (\S+)\)", up.stdout)
        assert found, up.stdout
        url, token = found.groups()
        assert url == f"http://127.0.0.1:{console}"
        kept = tmp_path / "stack" / "console-token"
        assert kept.read_text().strip() == token
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        assert _sign_in(url, token) == 200
        assert _sign_in(url, token + "x") == 403
        again = _stack(env, "up", "--services", "approval", "--port-base", str(health - 2))
        assert f"(development token: {token})" in again.stdout  # one token per stack
    finally:
        down = _stack(env, "down")
    assert down.returncode == 0, down.stdout + down.stderr


def test_up_moves_the_console_off_a_taken_port_and_prints_where(tmp_path: Path) -> None:
    health = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLBUS_")}
    env |= {
        "TOOLBUS_STACK_DIR": str(tmp_path / "stack"),
        "TOOLBUS_NATS_URL": f"nats://127.0.0.1:{free_port()}",
        "TOOLBUS_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "TOOLBUS_SUBJECT_PREFIX": f"tbtstackcm{health}",
        "TOOLBUS_GATEWAY_PORT": str(mcp := free_port()),
    }
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        held = holder.getsockname()[1]
        env["TOOLBUS_CONSOLE_PORT"] = str(held)
        try:
            up = _stack(env, "up", "--services", "approval,gateway", "--port-base", str(health - 2))
            assert up.returncode == 0, up.stdout + up.stderr
            found = re.search(
                r"console: (http://127\.0\.0\.1:(\d+))/ \(development token: (\S+)\)", up.stdout
            )
            assert found, up.stdout + up.stderr
            url, port, token = found.groups()
            assert int(port) != held
            assert f"console: port {held} is taken by another program, so it listens on {port}" in up.stderr
            assert _sign_in(url, token) == 200
            # `status` says where the console and the gateway's MCP endpoint are.
            status = _stack(env, "status")
            assert f"console: {url}/" in status.stdout, status.stdout
            assert f"MCP: http://127.0.0.1:{mcp}/mcp/<toolsetId>" in status.stdout, status.stdout
            processes = json.loads(_stack(env, "status", "--json").stdout)["processes"]
            assert processes["approval"]["console"] == f"{url}/"
            assert processes["gateway"]["mcp"] == f"http://127.0.0.1:{mcp}/mcp/<toolsetId>"
        finally:
            down = _stack(env, "down")
    assert down.returncode == 0, down.stdout + down.stderr
