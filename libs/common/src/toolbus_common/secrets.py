"""Authenticated encryption of stored secrets with `TOOLBUS_SECRET_KEY`.

The key setting is one Fernet key or a comma-separated list of them: the first encrypts, every one
decrypts. To rotate: prepend a new key, restart the services, re-encrypt what is stored
(`CredentialStore.rotate()`: credentials documents and OAuth records), then drop the old key. Generate a key with
`python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"`.

No error raised here ever contains a key or a plaintext.
"""

from __future__ import annotations

from typing import Protocol

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from pydantic import SecretStr

GENERATE_HINT = (
    'generate one with: python -c "from cryptography.fernet import Fernet; '
    'print(Fernet.generate_key().decode())"'
)


class _HasSecretKey(Protocol):
    @property
    def secret_key(self) -> SecretStr | None: ...


class DecryptionError(Exception):
    """A stored ciphertext could not be decrypted with any configured key (wrong or dropped key,
    or tampered data). The message never contains the key or the data."""


class Cipher:
    """Encrypts with the first key, decrypts with any; ciphertexts are authenticated (Fernet:
    AES-128-CBC + HMAC-SHA256), so tampering is detected, never silently decrypted."""

    def __init__(self, keys: str) -> None:
        parts = [k.strip() for k in (keys or "").split(",") if k.strip()]
        if not parts:
            raise ValueError(f"TOOLBUS_SECRET_KEY is not set: {GENERATE_HINT}")
        fernets: list[Fernet] = []
        for index, part in enumerate(parts):
            try:
                fernets.append(Fernet(part.encode()))
            except (ValueError, TypeError):
                # Never echo the key: say which entry is wrong and what a good one looks like.
                raise ValueError(
                    f"TOOLBUS_SECRET_KEY entry {index + 1} of {len(parts)} is not a Fernet key "
                    f"(32 url-safe base64-encoded bytes); {GENERATE_HINT}"
                ) from None
        self._fernet = MultiFernet(fernets)
        self.key_count = len(fernets)

    @classmethod
    def from_settings(cls, settings: _HasSecretKey) -> Cipher:
        """The cipher of `settings.secret_key`; `ValueError` with a clear message when missing or
        malformed (a start-up error)."""
        key = settings.secret_key
        return cls(key.get_secret_value() if key is not None else "")

    def encrypt(self, plaintext: bytes) -> bytes:
        return self._fernet.encrypt(plaintext)

    def decrypt(self, ciphertext: bytes) -> bytes:
        """The plaintext, or `DecryptionError` when no configured key opens it."""
        try:
            return self._fernet.decrypt(ciphertext)
        except InvalidToken:
            raise DecryptionError(
                "stored ciphertext could not be decrypted with any TOOLBUS_SECRET_KEY entry: "
                "was a key dropped before re-encrypting?"
            ) from None

    def rotate(self, ciphertext: bytes) -> bytes:
        """The same plaintext encrypted with the first key (for key rotation)."""
        try:
            return self._fernet.rotate(ciphertext)
        except InvalidToken:
            raise DecryptionError(
                "stored ciphertext could not be decrypted with any TOOLBUS_SECRET_KEY entry"
            ) from None

    def __repr__(self) -> str:
        return f"Cipher(keys=<{self.key_count} hidden>)"
