"""`scripts/stack.py` starts what is missing, leaves it running, and `down` stops exactly that."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.infra import (
    free_port,
    http_status,
    nats_answers,
    redis_answers,
    service_module_exists,
)

pytestmark = pytest.mark.integration

STACK_PY = Path(__file__).resolve().parents[2] / "scripts" / "stack.py"


def _stack(env: dict[str, str], *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(STACK_PY), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_up_starts_local_servers_and_a_service_and_down_stops_exactly_them(tmp_path: Path) -> None:
    nats_url = f"nats://127.0.0.1:{free_port()}"
    redis_url = f"redis://127.0.0.1:{free_port()}/0"
    approval_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TOOLBUS_SECRET_KEY"}
    env |= {
        "TOOLBUS_STACK_DIR": str(tmp_path / "stack"),
        "TOOLBUS_NATS_URL": nats_url,
        "TOOLBUS_REDIS_URL": redis_url,
        "TOOLBUS_SUBJECT_PREFIX": f"tbtstack{approval_port}",
    }
    with_service = service_module_exists("approval")
    # Left world-readable by an earlier `up` (before they were kept private): made private too.
    (tmp_path / "stack" / "logs").mkdir(parents=True)
    (tmp_path / "stack" / "logs").chmod(0o755)
    (tmp_path / "stack" / "logs" / "registry.log").write_text("old\n")
    (tmp_path / "stack" / "logs" / "registry.log").chmod(0o644)
    try:
        up = _stack(env, "up", "--services", "approval", "--port-base", str(approval_port - 2))
        assert up.returncode == 0, up.stdout + up.stderr
        # Logs, the Redis append-only files and the JetStream store: their owner's alone.
        modes = {
            str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode)
            for p in [tmp_path / "stack", *(tmp_path / "stack").rglob("*")]
        }
        assert any(name.startswith("stack/redis/") for name in modes)
        assert any(name.startswith("stack/nats/") for name in modes)
        assert {m for m in modes.values()} == {0o700, 0o600}
        assert {n: m for n, m in modes.items() if m != (0o700 if (tmp_path / n).is_dir() else 0o600)} == {}
        assert f"NATS            {nats_url}: started here" in up.stdout
        assert f"Redis           {redis_url}: started here" in up.stdout
        assert "new dev key generated into" in up.stdout
        key_file = tmp_path / "stack" / "secret.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert key_file.read_text().strip() not in up.stdout + up.stderr
        assert "dispatcher      not started: not asked for (--services)" in up.stdout
        assert nats_answers(nats_url)
        assert redis_answers(redis_url)
        if with_service:
            assert f"approval        ready: http://127.0.0.1:{approval_port}/healthz" in up.stdout
            assert http_status(f"http://127.0.0.1:{approval_port}/readyz") == 200

        again = _stack(env, "up", "--services", "approval", "--port-base", str(approval_port - 2))
        assert again.returncode == 0, again.stdout + again.stderr
        assert "started by an earlier `up`" in again.stdout
        assert "dev key from" in again.stdout
    finally:
        down = _stack(env, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "nats         pid" in down.stdout
    assert "redis        pid" in down.stdout
    assert not nats_answers(nats_url, jetstream=False)
    assert not redis_answers(redis_url)
    assert http_status(f"http://127.0.0.1:{approval_port}/readyz") is None
    assert list((tmp_path / "stack" / "pids").iterdir()) == []

    second = _stack(env, "down")
    assert second.returncode == 0
    assert "nothing to stop" in second.stdout


def test_down_never_signals_a_process_whose_pid_was_reused(tmp_path: Path) -> None:
    """A pidfile whose start time does not match the live process with that pid is only removed."""
    stack_dir = tmp_path / "stack"
    (stack_dir / "pids").mkdir(parents=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (stack_dir / "pids" / "registry.json").write_text(f'{{"pid": {bystander.pid}, "start": 1}}')
        down = _stack({**os.environ, "TOOLBUS_STACK_DIR": str(stack_dir)}, "down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"registry     pid {bystander.pid}: was not running" in down.stdout
        assert bystander.poll() is None
        assert not (stack_dir / "pids" / "registry.json").exists()
    finally:
        bystander.kill()
        bystander.wait()


def _own_servers_env(tmp_path: Path, tag: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TOOLBUS_SECRET_KEY", "TOOLBUS_PORT_BASE")}
    return env | {
        "TOOLBUS_STACK_DIR": str(tmp_path / "stack"),
        "TOOLBUS_NATS_URL": f"nats://127.0.0.1:{free_port()}",
        "TOOLBUS_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "TOOLBUS_SUBJECT_PREFIX": f"tbtstack{tag}",
    }


@pytest.mark.skipif(not service_module_exists("approval"), reason="toolbus_approval is not installed")
def test_a_service_port_held_by_another_program_moves_to_a_free_one(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        held = other.getsockname()[1]
        env = _own_servers_env(tmp_path, held) | {"TOOLBUS_PORT_BASE": str(held - 2)}
        try:
            up = _stack(env, "up", "--services", "approval", "--json")
            assert up.returncode == 0, up.stdout + up.stderr
            summary = json.loads(up.stdout)
            port = summary["services"]["approval"]["port"]
            assert port != held
            assert summary["portsMoved"] == [
                f"approval: port {held} is taken by another program, so it listens on {port}"
            ]
            assert f"note: approval: port {held} is taken" in up.stderr
            assert http_status(f"http://127.0.0.1:{port}/readyz") == 200
            status = _stack(env, "status", "--json")
            assert json.loads(status.stdout)["processes"]["approval"]["port"] == port
        finally:
            down = _stack(env, "down")
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.skipif(not service_module_exists("approval"), reason="toolbus_approval is not installed")
def test_a_failed_start_leaves_nothing_running(tmp_path: Path) -> None:
    env = _own_servers_env(tmp_path, free_port())
    up = _stack(env, "up", "--services", "approval", "--timeout", "0.01")  # no service is ready so soon
    assert up.returncode == 1, up.stdout + up.stderr
    assert "was not ready within" in up.stderr
    assert "what it started is stopped again: redis, nats" in up.stderr
    assert not nats_answers(env["TOOLBUS_NATS_URL"], jetstream=False)
    assert not redis_answers(env["TOOLBUS_REDIS_URL"])
    assert list((tmp_path / "stack" / "pids").iterdir()) == []


def test_up_serves_the_gateway_and_prints_its_mcp_url(tmp_path: Path) -> None:
    """`make up` starts the gateway like any service and prints its MCP URL
    (`TOOLBUS_GATEWAY_PORT`), which answers an MCP request without a token with 401."""
    if not service_module_exists("gateway"):
        pytest.skip("toolbus_gateway is not installed")
    nats_url = f"nats://127.0.0.1:{free_port()}"
    redis_url = f"redis://127.0.0.1:{free_port()}/0"
    health_port, mcp_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "TOOLBUS_SECRET_KEY"}
    env |= {
        "TOOLBUS_STACK_DIR": str(tmp_path / "stack"),
        "TOOLBUS_NATS_URL": nats_url,
        "TOOLBUS_REDIS_URL": redis_url,
        "TOOLBUS_SUBJECT_PREFIX": f"tbtstackgw{health_port}",
        "TOOLBUS_GATEWAY_PORT": str(mcp_port),
    }
    try:
        up = _stack(env, "up", "--services", "gateway", "--port-base", str(health_port - 4))
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"gateway         ready: http://127.0.0.1:{health_port}/healthz" in up.stdout
        assert f"MCP: http://127.0.0.1:{mcp_port}/mcp/<toolsetId>" in up.stdout
        assert http_status(f"http://127.0.0.1:{mcp_port}/mcp/ts_{'a' * 64}") == 401
    finally:
        down = _stack(env, "down")
    assert down.returncode == 0, down.stdout + down.stderr
