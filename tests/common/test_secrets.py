"""`Cipher`: authenticated encryption with rotation, and start-up errors that never echo the key."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr
from toolbus_common.secrets import Cipher, DecryptionError


class _Settings:
    def __init__(self, key: str | None) -> None:
        self.secret_key = SecretStr(key) if key is not None else None


def test_round_trip_and_ciphertext_does_not_contain_plaintext() -> None:
    cipher = Cipher(Fernet.generate_key().decode())
    token = cipher.encrypt(b"Bearer tok-very-secret")
    assert b"tok-very-secret" not in token
    assert cipher.decrypt(token) == b"Bearer tok-very-secret"


def test_first_key_encrypts_all_keys_decrypt_and_rotate_moves_to_the_first() -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    before = Cipher(old).encrypt(b"payload")
    both = Cipher(f"{new}, {old}")
    assert both.decrypt(before) == b"payload"
    rotated = both.rotate(before)
    assert Cipher(new).decrypt(rotated) == b"payload"
    with pytest.raises(DecryptionError):
        Cipher(old).decrypt(rotated)


def test_a_dropped_key_is_a_clear_error_without_data() -> None:
    token = Cipher(Fernet.generate_key().decode()).encrypt(b"Bearer abc")
    with pytest.raises(DecryptionError) as info:
        Cipher(Fernet.generate_key().decode()).decrypt(token)
    assert "Bearer" not in str(info.value)


def test_tampered_ciphertext_is_refused() -> None:
    cipher = Cipher(Fernet.generate_key().decode())
    token = bytearray(cipher.encrypt(b"x" * 32))
    token[-5] ^= 1
    with pytest.raises(DecryptionError):
        cipher.decrypt(bytes(token))


@pytest.mark.parametrize("value", [None, "", " , "])
def test_missing_key_says_how_to_generate_one(value: str | None) -> None:
    with pytest.raises(ValueError, match="generate_key"):
        Cipher.from_settings(_Settings(value))


def test_malformed_key_names_the_entry_and_never_echoes_it() -> None:
    bad = "not-a-fernet-key-but-a-secret-value"
    with pytest.raises(ValueError, match="entry 2 of 2") as info:
        Cipher(f"{Fernet.generate_key().decode()},{bad}")
    assert bad not in str(info.value)
    assert "generate_key" in str(info.value)


def test_repr_hides_keys() -> None:
    key = Fernet.generate_key().decode()
    assert key not in repr(Cipher(key))
