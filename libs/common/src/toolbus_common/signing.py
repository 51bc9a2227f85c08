"""Service-to-service commands signed with a key only the services hold: a command consumer
applies a message of the INTERNAL stream only if a service signed it, so nothing a client can
cause to land there (a JetStream answer aimed at an internal subject, a reply to a reply subject
it chose) is ever applied."""

from __future__ import annotations

import hashlib
import hmac
from typing import Protocol

from pydantic import SecretStr

SIGNATURE_HEADER = "Toolbus-Signature"
_CONTEXT = b"toolbus internal command v1\x00"


class HasSecretKey(Protocol):
    @property
    def secret_key(self) -> SecretStr | None: ...


class CommandSigner:
    """HMAC-SHA256 over a command's subject and body, keyed from `TOOLBUS_SECRET_KEY` (which
    every service of a deployment shares; the key itself never leaves the process)."""

    __slots__ = ("_key",)

    def __init__(self, secret_key: SecretStr) -> None:
        self._key = hashlib.sha256(_CONTEXT + secret_key.get_secret_value().encode()).digest()

    @classmethod
    def of(cls, settings: HasSecretKey) -> CommandSigner:
        """The signer of `settings.secret_key`; `ValueError` naming the setting when it is unset."""
        if settings.secret_key is None or not settings.secret_key.get_secret_value():
            raise ValueError(
                "TOOLBUS_SECRET_KEY is not set: every service needs it (the same key in all of them) "
                "to sign and check the commands they send one another"
            )
        return cls(settings.secret_key)

    def sign(self, subject: str, body: bytes) -> str:
        return hmac.new(self._key, subject.encode() + b"\n" + body, hashlib.sha256).hexdigest()

    def headers(self, subject: str, body: bytes, msg_id: str | None = None) -> dict[str, str]:
        """The headers of a signed command (with its `Nats-Msg-Id` when given)."""
        headers = {SIGNATURE_HEADER: self.sign(subject, body)}
        if msg_id:
            headers["Nats-Msg-Id"] = msg_id
        return headers

    def verify(self, subject: str, body: bytes, signature: str | None) -> bool:
        """Whether a service signed this body for this subject."""
        return bool(signature) and hmac.compare_digest(self.sign(subject, body), str(signature))
