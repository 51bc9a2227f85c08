"""toolbus services as processes: `python -m toolbus_<name>` on a port, ready when `/readyz` says so."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolbus_devstack.processes import (
    ServerStartError,
    http_status,
    listening_socket,
    log_tail,
    open_own_log,
    spawn,
    stop_process,
)


def service_module_exists(name: str) -> bool:
    """True when `python -m toolbus_<name>` can run here (the package has a `__main__`)."""
    import importlib.util

    try:
        return importlib.util.find_spec(f"toolbus_{name}.__main__") is not None
    except (ImportError, ValueError):
        return False


def wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path, *, what: str, timeout: float) -> None:
    """Wait until `url` answers 200; raise `ServerStartError` with the log tail if `proc` exits or
    the time runs out."""
    deadline = time.monotonic() + timeout
    last: int | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(
                f"{what} exited with code {proc.returncode} before {url} answered 200. "
                f"Log tail ({log_path}):\n{log_tail(log_path)}"
            )
        # A socket handed down by launch_service accepts before the child serves: the probe waits
        # in its backlog and is answered as soon as the child serves (a dead child resets it).
        last = http_status(url, timeout=5.0)
        if last == 200:
            return
        time.sleep(0.1)
    seen = "nothing answered" if last is None else f"last status {last}"
    raise ServerStartError(
        f"{what} was not ready within {timeout:.0f}s ({url}: {seen}). "
        f"Log tail ({log_path}):\n{log_tail(log_path)}"
    )


@dataclass
class ServiceProcess:
    """A toolbus service running as `python -m toolbus_<name>`: `proc` is its `Popen`."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    log_path: Path
    host: str = "127.0.0.1"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ready_url(self) -> str:
        return f"{self.base_url}/readyz"

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown code runs."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM then wait (SIGKILL after `grace` s); returns the exit code."""
        return stop_process(self.proc, grace)

    def log(self) -> str:
        return log_tail(self.log_path, lines=200)


DEV_EGRESS_ALLOW = "127.0.0.0/8,::1,localhost"
"""`TOOLBUS_EGRESS_ALLOW` of the services a development stack starts (`make up`, the tests, the
benches) unless the environment sets it: this machine's loopback, where their MCP servers and
test HTTP servers listen. A deployment's default (empty) allows none of it."""


def launch_service(
    name: str,
    env: Mapping[str, str],
    *,
    port: int | None = None,
    log_dir: Path | None = None,
    detach: bool = False,
    python: str | None = None,
    log_header: str = "",
) -> ServiceProcess:
    """Spawn `python -m toolbus_<name>` with `env` over this process's environment; does not wait
    (see `wait_ready`). Its output goes to `<name>.log` in `log_dir` (default: a new temporary
    directory), or `<name>-2.log`, ... while another running process writes that file
    (`open_own_log`), after `log_header`.

    On `port` (`TOOLBUS_HTTP_PORT`) when one is given; else on a socket bound here to a port the
    OS picks and handed down (`TOOLBUS_HTTP_FD`), so nothing can take the port while the child
    starts (a free port chosen here and bound by the child seconds later could be taken
    meanwhile, by an outgoing connection's local port among others)."""
    full_env = {**os.environ, **env}
    full_env.pop("TOOLBUS_HTTP_FD", None)  # an env copied from an earlier process carries its fd
    full_env.setdefault("TOOLBUS_HTTP_HOST", "127.0.0.1")
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env.setdefault("TOOLBUS_EGRESS_ALLOW", DEV_EGRESS_ALLOW)
    log_dir = log_dir if log_dir is not None else Path(tempfile.mkdtemp(prefix=f"toolbus-{name}-"))
    # `<name>.log`, or `<name>-2.log`, ... while another running process writes that one.
    log_path, log = open_own_log(log_dir / f"{name}.log")
    if log_header:
        log.write(log_header.encode())
        log.flush()
    argv = [python or sys.executable, "-m", f"toolbus_{name}"]
    if port is not None:
        full_env["TOOLBUS_HTTP_PORT"] = str(port)
        proc = spawn(argv, log, env=full_env, detach=detach)
        return ServiceProcess(name, proc, port, full_env, log_path)
    with listening_socket(full_env["TOOLBUS_HTTP_HOST"]) as listener:  # the child keeps its copy
        port = listener.getsockname()[1]
        full_env["TOOLBUS_HTTP_PORT"] = str(port)
        full_env["TOOLBUS_HTTP_FD"] = str(listener.fileno())
        proc = spawn(argv, log, env=full_env, detach=detach, pass_fds=[listener.fileno()])
    return ServiceProcess(name, proc, port, full_env, log_path)


def start_service(
    name: str, env: Mapping[str, str], *, ready_timeout: float = 60.0, **kwargs: Any
) -> ServiceProcess:
    """`launch_service(...)`, then return once `/readyz` answers 200 (stopping it on failure)."""
    service = launch_service(name, env, **kwargs)
    try:
        wait_ready(
            service.ready_url, service.proc, service.log_path, what=f"toolbus_{name}", timeout=ready_timeout
        )
    except BaseException:
        stop_process(service.proc, grace=5.0)
        raise
    return service


@contextlib.contextmanager
def service_process(name: str, env: Mapping[str, str], **kwargs: Any) -> Iterator[ServiceProcess]:
    """A ready `toolbus_<name>` for the `with` body, then SIGTERM (SIGKILL if it hangs).

    Keyword arguments: `port`, `log_dir`, `ready_timeout` (default 60 s), `python`.
    """
    service = start_service(name, env, **kwargs)
    try:
        yield service
    finally:
        stop_process(service.proc)
