"""The whole toolbus stack for a bench: the four services as processes (`python -m toolbus_<name>`,
as `make up` runs them) on a fresh subject and Redis prefix of the local NATS and Redis, an MCP echo
server in its own process, the echo toolset registered through the registry and a run opened.

    async with BenchStack() as stack:
        await stack.invoke()                  # one calls.invoke of echo.echo
        stack.pids()                          # {"registry": pid, "dispatcher": pid, ...}
        stack.idle_rss                        # RSS of each service before any request

Everything it made (streams, buckets, Redis keys under its prefix, processes) is removed on exit.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

import nats
import orjson
from cryptography.fernet import Fernet
from toolbus_contracts import Subjects

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import rss_mib, start_mcp_server
from tests.support.infra import (
    ServiceProcess,
    drop_deployment_state,
    launch_service,
    stop_process,
    unique_prefix,
    wait_ready,
)

NATS_URL = os.environ.get("TOOLBUS_NATS_URL", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("TOOLBUS_REDIS_URL", "redis://127.0.0.1:6379/0")
SERVICES = ("registry", "dispatcher", "approval", "credentials")


class BenchStack:
    """All four services, one MCP echo server, one registered toolset and one open run."""

    def __init__(
        self,
        services: tuple[str, ...] = SERVICES,
        *,
        python: dict[str, str] | None = None,
        ready: float = 90,
        nats_url: str = NATS_URL,
        redis_url: str = REDIS_URL,
    ) -> None:
        """`python`: the interpreter (or a wrapper such as valgrind's) to start a service with;
        `nats_url`, `redis_url`: the servers (default: the local ones, or TOOLBUS_NATS_URL /
        TOOLBUS_REDIS_URL; `bench/servers.py` starts private ones)."""
        self.python = python or {}
        self.nats_url = nats_url
        self.redis_url = redis_url
        self.ready_timeout = ready
        self.prefix = unique_prefix("tbbench")
        self.subjects = Subjects(self.prefix)
        self.env = {
            "TOOLBUS_NATS_URL": nats_url,
            "TOOLBUS_REDIS_URL": redis_url,
            "TOOLBUS_SUBJECT_PREFIX": self.prefix,
            "TOOLBUS_REDIS_PREFIX": self.prefix,
            "TOOLBUS_SECRET_KEY": Fernet.generate_key().decode(),
            "TOOLBUS_LOG_LEVEL": "WARNING",
        }
        self.names = services
        self.services: dict[str, ServiceProcess] = {}
        self.extra: list[ServiceProcess] = []
        self.mcp: subprocess.Popen[str] | None = None
        self.url = ""
        self.nc: Any = None
        self.toolset_id = ""
        self.run_id = ""
        self.invoke_body = b""
        self.idle_rss: dict[str, float] = {}
        """RSS (MiB) of each service once ready, before any request (the toolset is registered after)."""

    async def _start(self, names: tuple[str, ...]) -> list[ServiceProcess]:
        started = [  # spawned on this (main) thread
            launch_service(name, self.env, python=self.python.get(name)) for name in names
        ]
        try:
            await asyncio.gather(
                *(
                    asyncio.to_thread(
                        wait_ready, s.ready_url, s.proc, s.log_path, what=s.name, timeout=self.ready_timeout
                    )
                    for s in started
                )
            )
        except BaseException:
            for s in started:
                stop_process(s.proc, grace=5.0)
            raise
        return started

    async def __aenter__(self) -> BenchStack:
        self.mcp, self.url = start_mcp_server()
        try:
            self.nc = await nats.connect(self.nats_url)
            for service in await self._start(self.names):
                self.services[service.name] = service
            await asyncio.sleep(1.0)  # settled: imports done, connections open, nothing asked yet
            self.idle_rss = {name: rss_mib(s.proc.pid) for name, s in self.services.items()}
            spec = {"mcp": [{"name": "echo", "url": self.url}]}
            data = await self.ok(self.subjects.toolsets_create, spec, timeout=60)
            self.toolset_id = data["id"]
            self.run_id = (await self.ok(self.subjects.runs_open, {"toolsetId": self.toolset_id}))["runId"]
            self.invoke_body = orjson.dumps(
                {"runId": self.run_id, "tool": "echo.echo", "input": {"text": "hi"}}
            )
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def add_dispatcher(self) -> ServiceProcess:
        """One more dispatcher process in the same deployment (same queue group, same Redis)."""
        (service,) = await self._start(("dispatcher",))
        self.extra.append(service)
        return service

    async def ok(self, subject: str, body: dict[str, Any] | bytes, timeout: float = 30) -> Any:  # noqa: ASYNC109
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        reply = orjson.loads((await self.nc.request(subject, data, timeout=timeout)).data)
        if not reply.get("ok"):
            raise RuntimeError(f"{subject}: {reply}")
        return reply["data"]

    async def invoke(self) -> object:
        """One `calls.invoke` of `echo.echo` in the open run (a fresh call each time)."""
        msg = await self.nc.request(self.subjects.calls_invoke, self.invoke_body, timeout=30)
        if not msg.data.startswith(b'{"ok":true'):
            raise RuntimeError(msg.data[:300].decode())
        return msg

    def pids(self) -> dict[str, int]:
        return {name: s.proc.pid for name, s in self.services.items()}

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for service in [*self.extra, *self.services.values()]:
            await asyncio.to_thread(stop_process, service.proc)
        if self.mcp is not None:
            self.mcp.terminate()
            self.mcp.wait(10)
        if self.nc is not None:
            await drop_deployment_state(self.nc, self.redis_url, self.prefix)
            await self.nc.close()
