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
    every service of a deployment shares; the key itself never leaves the process).

    Each key of the setting (a comma-separated list while `TOOLBUS_SECRET_KEY` rotates) gives a
    signature, all sent in the header, comma-separated; a command is accepted when any of them is
    one of this service's keys'. So through a rolling rotation (services on `old`, then on
    `new,old`, then on `new`) every command one service signs, another verifies."""

    __slots__ = ("_keys",)

    def __init__(self, secret_key: SecretStr) -> None:
        value = secret_key.get_secret_value()
        entries = [k.strip() for k in value.split(",") if k.strip()] or [value]
        self._keys = tuple(hashlib.sha256(_CONTEXT + entry.encode()).digest() for entry in entries)

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
        message = subject.encode() + b"\n" + body
        return ",".join(hmac.new(key, message, hashlib.sha256).hexdigest() for key in self._keys)

    def headers(self, subject: str, body: bytes, msg_id: str | None = None) -> dict[str, str]:
        """The headers of a signed command (with its `Nats-Msg-Id` when given)."""
        headers = {SIGNATURE_HEADER: self.sign(subject, body)}
        if msg_id:
            headers["Nats-Msg-Id"] = msg_id
        return headers

    def verify(self, subject: str, body: bytes, signature: str | None) -> bool:
        """Whether a service signed this body for this subject (with a key this one holds)."""
        if not signature:
            return False
        message = subject.encode() + b"\n" + body
        given = str(signature).split(",")[:8]
        for key in self._keys:
            mine = hmac.new(key, message, hashlib.sha256).hexdigest()
            if any(hmac.compare_digest(mine, g) for g in given):
                return True
        return False
