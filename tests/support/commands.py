"""Service-to-service commands as a test sends them in a service's place: signed with the
deployment's `TOOLBUS_SECRET_KEY` (toolbus_common.signing), as the consumers require."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr
from toolbus_common.signing import CommandSigner

TEST_SECRET_KEY = "dGVzdC1vbmx5LWtleS1mb3ItdG9vbGJ1cy10ZXN0cyE="
"""A fixed Fernet key for services a test builds in-process (never a deployment's)."""


def signed(
    subject: str, body: bytes, *, secret: str = TEST_SECRET_KEY, msg_id: str | None = None
) -> dict[str, str]:
    """The headers a service would give this command."""
    return CommandSigner(SecretStr(secret)).headers(subject, body, msg_id)


async def publish_command(
    js: Any,
    subject: str,
    body: bytes,
    *,
    secret: str = TEST_SECRET_KEY,
    msg_id: str | None = None,
    **kwargs: Any,
) -> Any:
    """A JetStream publish of a signed command (the INTERNAL stream acks it)."""
    headers = signed(subject, body, secret=secret, msg_id=msg_id) | dict(kwargs.pop("headers", None) or {})
    return await js.publish(subject, body, headers=headers, **kwargs)
