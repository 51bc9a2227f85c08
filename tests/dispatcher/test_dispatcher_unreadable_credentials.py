"""Credentials stored under a key the dispatcher does not have (a key dropped before re-encrypting,
or another checkout's `make up` dev key on a shared Redis) are treated as expired: the call is
parked at that level, unsent, and announced like a 401 (`CallParked`, so the credentials service
sends `credentials.expired` and resumes it when they are set again). They ended the call
`internal` before. Resolution never falls back past them to a less specific level's headers."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from toolbus_common.credential_store import CredentialStore
from toolbus_common.secrets import Cipher
from toolbus_contracts.credentials import Credentials
from toolbus_dispatcher.credentials import StoreCredentials

from tests.dispatcher.test_dispatcher_helpers import Harness
from tests.dispatcher.test_dispatcher_mcp import mcp_toolset
from tests.support.mcp_servers import token_server

pytestmark = pytest.mark.integration

TOKEN = "t-readable"


def _bearer(token: str) -> Credentials:
    return Credentials.model_validate(
        {"servers": {"echo": {"headers": {"Authorization": f"Bearer {token}"}}}}
    )


async def test_credentials_no_key_decrypts_park_the_call_unsent_at_their_level(
    nats_url: str, redis_url: str
) -> None:
    h = Harness(nats_url, redis_url)
    await h.connect()
    ours = Cipher(Fernet.generate_key().decode())
    theirs = Cipher(Fernet.generate_key().decode())
    try:
        async with token_server(TOKEN, name="echo") as server:
            assert h.redis is not None
            await h.dispatcher(credentials=StoreCredentials(CredentialStore(h.redis, h.keys, ours)))
            ts = await mcp_toolset(h, server.url)
            # The toolset's credentials are readable and would be accepted; the namespace's, more
            # specific, were written under another key.
            await CredentialStore(h.redis, h.keys, ours).set(
                "toolset", toolset_id=ts, credentials=_bearer(TOKEN)
            )
            await CredentialStore(h.redis, h.keys, theirs).set(
                "namespace", toolset_id=ts, namespace="user-9", credentials=_bearer("t-other")
            )
            run = await h.open_run(ts, namespace="user-9")
            before = len(server.calls_to("echo"))
            started = await h.ok(
                h.subjects.calls_start, {"runId": run, "tool": "echo.echo", "input": {"text": "x"}}
            )
            await h.wait_state(started["callId"], "parked")
            assert server.calls_to("echo")[before:] == []  # nothing sent, not with the toolset's token either
            parked = await h.first_internal(h.subjects.internal_calls_park, "callId", started["callId"])
            assert (parked["level"], parked["server"]) == ("namespace", "echo")
    finally:
        await h.close()
