"""`CredentialStore` against real Redis: level precedence, never merging, only ciphertext stored,
and the version-checked cache (a set shows on the very next resolve; no I/O while unchanged)."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from cryptography.fernet import Fernet
from toolbus_common.credential_store import CredentialStore
from toolbus_common.keys import Keys
from toolbus_common.secrets import Cipher
from toolbus_contracts.credentials import CredentialLevel, Credentials

pytestmark = pytest.mark.integration

TS = "ts_" + "a" * 64


def creds(**servers: dict[str, str]) -> Credentials:
    return Credentials.model_validate({"servers": {name: {"headers": h} for name, h in servers.items()}})


@pytest.fixture
def store(redis_client: Any, redis_prefix: str) -> CredentialStore:
    keys = Keys(f"{redis_prefix}:store{secrets.token_hex(3)}")
    return CredentialStore(redis_client, keys, Cipher(Fernet.generate_key().decode()))


LEVELS = ["toolset", "namespace", "run"]


@pytest.mark.parametrize(
    "present",
    [
        (),
        ("toolset",),
        ("namespace",),
        ("run",),
        ("toolset", "namespace"),
        ("toolset", "run"),
        ("namespace", "run"),
        ("toolset", "namespace", "run"),
    ],
)
async def test_the_most_specific_level_with_an_entry_wins(
    store: CredentialStore, present: tuple[CredentialLevel, ...]
) -> None:
    for level in present:
        await store.set(
            level,
            toolset_id=TS,
            namespace="user-1",
            run_id="run-1",
            credentials=creds(github={"Authorization": f"Bearer {level}"}),
        )
    got = await store.resolve(toolset_id=TS, namespace="user-1", run_id="run-1", server="github")
    expected = next((lvl for lvl in ("run", "namespace", "toolset") if lvl in present), None)
    assert got.level == expected
    assert got.headers == ({"Authorization": f"Bearer {expected}"} if expected else {})


async def test_headers_of_two_levels_are_never_merged(store: CredentialStore) -> None:
    await store.set(
        "toolset", toolset_id=TS, credentials=creds(github={"Authorization": "Bearer t", "X-Org": "acme"})
    )
    await store.set("run", toolset_id=TS, run_id="r", credentials=creds(github={"X-Other": "1"}))
    got = await store.resolve(toolset_id=TS, namespace=None, run_id="r", server="github")
    assert got.level == "run"
    assert got.headers == {"X-Other": "1"}


async def test_a_level_without_an_entry_for_the_server_falls_through(store: CredentialStore) -> None:
    await store.set("toolset", toolset_id=TS, credentials=creds(github={"Authorization": "Bearer t"}))
    await store.set("run", toolset_id=TS, run_id="r", credentials=creds(stripe={"Authorization": "Bearer s"}))
    github = await store.resolve(toolset_id=TS, namespace=None, run_id="r", server="github")
    stripe = await store.resolve(toolset_id=TS, namespace=None, run_id="r", server="stripe")
    assert (github.level, github.headers) == ("toolset", {"Authorization": "Bearer t"})
    assert (stripe.level, stripe.headers) == ("run", {"Authorization": "Bearer s"})


async def test_namespace_scope_is_per_toolset_and_namespace(store: CredentialStore) -> None:
    await store.set("namespace", toolset_id=TS, namespace="alice", credentials=creds(github={"A": "alice"}))
    assert (await store.resolve(toolset_id=TS, namespace="bob", run_id=None, server="github")).level is None
    other = "ts_" + "b" * 64
    assert (
        await store.resolve(toolset_id=other, namespace="alice", run_id=None, server="github")
    ).level is None
    assert (await store.resolve(toolset_id=TS, namespace="alice", run_id=None, server="github")).headers == {
        "A": "alice"
    }


async def test_a_set_replaces_everything_at_its_level(store: CredentialStore) -> None:
    await store.set("toolset", toolset_id=TS, credentials=creds(github={"A": "1"}, stripe={"B": "2"}))
    await store.set("toolset", toolset_id=TS, credentials=creds(github={"C": "3"}))
    assert (await store.resolve(toolset_id=TS, namespace=None, run_id=None, server="stripe")).level is None
    assert (await store.resolve(toolset_id=TS, namespace=None, run_id=None, server="github")).headers == {
        "C": "3"
    }


async def test_redis_holds_only_ciphertext(store: CredentialStore, redis_client: Any) -> None:
    token = "tok-" + secrets.token_hex(12)
    await store.set("toolset", toolset_id=TS, credentials=creds(github={"Authorization": f"Bearer {token}"}))
    prefix = store.key("toolset", toolset_id=TS).rsplit(":cred:", 1)[0]
    keys = [k async for k in redis_client.scan_iter(match=f"{prefix}:*")]
    assert keys
    for key in keys:
        assert token.encode() not in (await redis_client.dump(key) or b"")
        if await redis_client.type(key) == b"string":  # not the index of documents (a set of keys)
            value = await redis_client.get(key)
            assert value is None or token.encode() not in value


async def test_a_set_takes_effect_on_the_very_next_resolve_with_the_new_version(
    store: CredentialStore,
) -> None:
    v1 = await store.set("toolset", toolset_id=TS, credentials=creds(github={"Authorization": "Bearer old"}))
    first = await store.resolve(toolset_id=TS, namespace="n", run_id="r", server="github", version=v1)
    assert first.headers == {"Authorization": "Bearer old"}
    v2 = await store.set("toolset", toolset_id=TS, credentials=creds(github={"Authorization": "Bearer new"}))
    assert v2 == await store.version() and v2 > v1
    second = await store.resolve(toolset_id=TS, namespace="n", run_id="r", server="github", version=v2)
    assert second.headers == {"Authorization": "Bearer new"}


class _CountingRedis:
    """Counts every command the store sends (resolve uses plain commands, no pipeline)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return await self.inner.execute_command(*args, **kwargs)

    async def mget(self, keys: list[str]) -> Any:
        self.calls += 1
        return await self.inner.mget(keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_no_redis_command_while_the_version_is_unchanged(redis_client: Any, redis_prefix: str) -> None:
    counting = _CountingRedis(redis_client)
    keys = Keys(f"{redis_prefix}:count{secrets.token_hex(3)}")
    store = CredentialStore(counting, keys, Cipher(Fernet.generate_key().decode()))  # type: ignore[arg-type]
    version = await store.set("toolset", toolset_id=TS, credentials=creds(github={"A": "1"}))
    await store.resolve(toolset_id=TS, namespace="n", run_id="r", server="github", version=version)
    before = counting.calls
    for _ in range(100):
        got = await store.resolve(toolset_id=TS, namespace="n", run_id="r", server="github", version=version)
        assert got.headers == {"A": "1"}
    assert counting.calls == before
    # A new version reads again, once.
    version = await store.set("run", toolset_id=TS, run_id="r", credentials=creds(github={"B": "2"}))
    before = counting.calls
    got = await store.resolve(toolset_id=TS, namespace="n", run_id="r", server="github", version=version)
    got = await store.resolve(toolset_id=TS, namespace="n", run_id="r", server="github", version=version)
    assert (got.level, got.headers) == ("run", {"B": "2"})
    assert counting.calls == before + 1


async def test_an_older_version_is_answered_from_redis_without_spoiling_the_cache(
    store: CredentialStore,
) -> None:
    v1 = await store.set("toolset", toolset_id=TS, credentials=creds(github={"A": "old"}))
    v2 = await store.set("toolset", toolset_id=TS, credentials=creds(github={"A": "new"}))
    assert (
        await store.resolve(toolset_id=TS, namespace=None, run_id=None, server="github", version=v2)
    ).headers == {"A": "new"}
    await store.resolve(toolset_id=TS, namespace=None, run_id=None, server="github", version=v1)
    assert (
        await store.resolve(toolset_id=TS, namespace=None, run_id=None, server="github", version=v2)
    ).headers == {"A": "new"}


async def test_delete_run_drops_only_run_credentials(store: CredentialStore) -> None:
    await store.set("toolset", toolset_id=TS, credentials=creds(github={"A": "t"}))
    await store.set("run", toolset_id=TS, run_id="r", credentials=creds(github={"A": "r"}))
    await store.delete_run("r")
    got = await store.resolve(toolset_id=TS, namespace=None, run_id="r", server="github")
    assert (got.level, got.headers) == ("toolset", {"A": "t"})


async def test_rotate_reencrypts_under_the_new_first_key(redis_client: Any, redis_prefix: str) -> None:
    keys = Keys(f"{redis_prefix}:rot{secrets.token_hex(3)}")
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    await CredentialStore(redis_client, keys, Cipher(old)).set(
        "toolset", toolset_id=TS, credentials=creds(g={"A": "1"})
    )
    assert await CredentialStore(redis_client, keys, Cipher(f"{new},{old}")).rotate() == 1
    got = await CredentialStore(redis_client, keys, Cipher(new)).resolve(
        toolset_id=TS, namespace=None, run_id=None, server="g"
    )
    assert got.headers == {"A": "1"}


def test_resolved_repr_hides_header_values() -> None:
    from toolbus_common.credential_store import Resolved

    assert "tok" not in repr(Resolved({"Authorization": "Bearer tok"}, "run"))


async def test_index_existing_indexes_documents_set_before_the_index(
    redis_client: Any, redis_prefix: str
) -> None:
    """Documents stored before `rotate` walked an index (no index key) are found by
    `index_existing` (an operator's SCAN), the set-version counters beside them are not; `rotate`
    then re-encrypts them all."""
    keys = Keys(f"{redis_prefix}:idx{secrets.token_hex(3)}")
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    before = CredentialStore(redis_client, keys, Cipher(old))
    await before.set("toolset", toolset_id=TS, credentials=creds(g={"A": "1"}))
    await before.set("namespace", toolset_id=TS, namespace="n", credentials=creds(g={"A": "2"}))
    await redis_client.set(keys.credentials_set_version("toolset", TS), 3)
    await redis_client.delete(keys.credentials_index)  # as stored by a version without the index
    after = CredentialStore(redis_client, keys, Cipher(f"{new},{old}"))
    assert await after.rotate() == 0
    assert await after.index_existing() == 2
    assert await after.rotate() == 2
    got = await CredentialStore(redis_client, keys, Cipher(new)).resolve(
        toolset_id=TS, namespace="n", run_id=None, server="g"
    )
    assert got.headers == {"A": "2"}


async def test_rotate_keeps_the_ttl_of_pending_records_and_index_existing_finds_oauth_records(
    redis_client: Any, redis_prefix: str
) -> None:
    """OAuth records follow the same path: a pending flow indexed with its TTL is re-encrypted
    and keeps its TTL; OAuth records stored before the indexes are found by `index_existing`;
    a record gone (expired) leaves the index at the next `rotate`."""
    keys = Keys(f"{redis_prefix}:orot{secrets.token_hex(3)}")
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    stored = Cipher(old).encrypt(b"{}")
    flow, conn, gone = (
        keys.oauth_flow("d1"),
        keys.oauth_connection("toolset", TS, "g"),
        keys.oauth_client("x"),
    )
    await redis_client.set(flow, stored, px=60_000)
    await redis_client.set(conn, stored)
    rotating = CredentialStore(redis_client, keys, Cipher(f"{new},{old}"))
    assert await rotating.index_existing() == 2
    await redis_client.sadd(keys.credentials_index, gone)
    assert await rotating.rotate() == 2
    assert 0 < await redis_client.pttl(flow) <= 60_000
    for key in (flow, conn):
        assert Cipher(new).decrypt(await redis_client.get(key)) == b"{}"
    assert not await redis_client.sismember(keys.credentials_index, gone)
