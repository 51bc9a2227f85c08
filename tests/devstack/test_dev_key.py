"""Where `make up` keeps its development key when `TOOLBUS_SECRET_KEY` is unset: one per user, so
two checkouts on the same NATS and Redis read each other's credentials."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from toolbus_devstack import stack


@pytest.fixture
def checkouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.delenv("TOOLBUS_SECRET_KEY", raising=False)
    monkeypatch.delenv("TOOLBUS_STACK_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    stack.use_dir(Path(".stack"))


def _key_in(checkout: Path) -> tuple[str, str]:
    stack.use_dir(checkout / ".stack", checkout)
    return stack._secret_key()


def test_two_checkouts_of_one_user_share_one_dev_key(checkouts: Path) -> None:
    first, how = _key_in(checkouts / "a")
    assert "new dev key generated into" in how and first not in how
    Fernet(first.encode())  # a usable key
    user_file = checkouts / "config" / "toolbus" / "dev-secret.key"
    assert stat.S_IMODE(user_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(user_file.parent.stat().st_mode) == 0o700
    second, how = _key_in(checkouts / "b")
    assert second == first
    assert how.startswith("dev key from ") and how.endswith("toolbus/dev-secret.key")
    assert not (checkouts / "a" / ".stack" / "secret.key").exists()


def test_a_checkouts_own_key_from_before_is_kept(checkouts: Path) -> None:
    (checkouts / "old" / ".stack").mkdir(parents=True)
    legacy = Fernet.generate_key().decode()
    (checkouts / "old" / ".stack" / "secret.key").write_text(legacy + "\n")
    assert _key_in(checkouts / "old")[0] == legacy
    assert _key_in(checkouts / "new")[0] != legacy


def test_the_environment_wins(checkouts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = Fernet.generate_key().decode()
    monkeypatch.setenv("TOOLBUS_SECRET_KEY", key)
    assert _key_in(checkouts / "a") == (key, "from TOOLBUS_SECRET_KEY")
    assert not (checkouts / "config").exists()


def test_an_unwritable_config_dir_falls_back_to_the_checkout(checkouts: Path) -> None:
    (checkouts / "config").write_text("a file where the directory would be")
    key, how = _key_in(checkouts / "a")
    assert (checkouts / "a" / ".stack" / "secret.key").read_text().strip() == key
    assert "new dev key generated into" in how
