"""A private nats-server (JetStream in a temporary store directory, monitoring port on) and a
private redis-server on free ports, for benches that read the servers' own CPU and counters
(the shared ones on 4222 and 6379 serve everyone else's work too).

    with PrivateServers() as servers:
        servers.nats_url, servers.redis_url        # to give BenchStack
        servers.pids()                             # {"nats-server": pid, "redis-server": pid}
        servers.varz()                             # nats-server's /varz (in_msgs, out_bytes, ...)

The Redis one is configured as the shared development Redis is (no RDB snapshots, no AOF); the
NATS one stores JetStream on disk (file storage), as the shared one does.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from toolbus_devstack import free_port


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port} within {timeout} s")


class PrivateServers:
    """nats-server -js and redis-server of this bench's own, stopped (and their data removed) on exit."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tbbench-servers-"))
        self.nats_port = free_port()
        self.monitor_port = free_port()
        self.redis_port = free_port()
        self.nats_url = f"nats://127.0.0.1:{self.nats_port}"
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> PrivateServers:
        nats = shutil.which("nats-server")
        redis = shutil.which("redis-server")
        if nats is None or redis is None:
            raise SystemExit("nats-server and redis-server must be on PATH")
        try:
            self.procs["nats-server"] = subprocess.Popen(
                [
                    nats,
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(self.nats_port),
                    "-m",
                    str(self.monitor_port),
                    "-js",
                    "-sd",
                    str(self.dir / "nats"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.procs["redis-server"] = subprocess.Popen(
                [
                    redis,
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(self.redis_port),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.dir),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _wait_port(self.nats_port, self.procs["nats-server"], "nats-server")
            _wait_port(self.monitor_port, self.procs["nats-server"], "nats-server monitoring")
            _wait_port(self.redis_port, self.procs["redis-server"], "redis-server")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def varz(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/varz", timeout=5) as r:
            data: dict[str, Any] = json.loads(r.read())
        return data

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
