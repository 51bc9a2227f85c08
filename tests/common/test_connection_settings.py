"""NATS and Redis connection settings: which credentials are sent, when TLS is on, how the
Sentinel list and server lists are read, and that no secret shows in a repr."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError
from toolbus_common.connections import JsPlacement, events_stream_limits, nats_connect_options
from toolbus_common.settings import Settings
from toolbus_devstack.tls import make_dev_pki
from toolbus_nats_connect import NatsAuth


def test_credentials_precedence_is_creds_then_nkey_then_user_then_token() -> None:
    base = {"TOOLBUS_NATS_USER": "harness", "TOOLBUS_NATS_PASSWORD": "pw", "TOOLBUS_NATS_TOKEN": "tok"}
    both = {**base, "TOOLBUS_NATS_CREDS_FILE": "/c.creds", "TOOLBUS_NATS_NKEY_FILE": "/s.nk"}
    assert NatsAuth.from_env(both).connect_options()["user_credentials"] == "/c.creds"
    nkey = NatsAuth.from_env({**base, "TOOLBUS_NATS_NKEY_FILE": "/s.nk"}).connect_options()
    assert nkey["nkeys_seed"] == "/s.nk" and "user" not in nkey
    user = NatsAuth.from_env(base).connect_options()
    assert (user["user"], user["password"]) == ("harness", "pw") and "token" not in user
    token = NatsAuth.from_env({"TOOLBUS_NATS_TOKEN": "tok"}).connect_options()
    assert token["token"] == "tok"
    assert "tls" not in token and token["inbox_prefix"] == "_INBOX"


def test_servers_inbox_and_no_secret_in_repr() -> None:
    env = {
        "TOOLBUS_NATS_URL": "nats://a:4222, nats://b:4222",
        "TOOLBUS_NATS_USER": "worker",
        "TOOLBUS_NATS_PASSWORD": "s3cret-pw",
        "TOOLBUS_NATS_INBOX_PREFIX": "_INBOX.worker",
    }
    auth = NatsAuth.from_env(env)
    options = auth.connect_options()
    assert options["servers"] == ["nats://a:4222", "nats://b:4222"]
    assert options["inbox_prefix"] == "_INBOX.worker"
    assert "s3cret-pw" not in repr(auth)
    settings = Settings(nats_url=env["TOOLBUS_NATS_URL"], nats_password="s3cret-pw")
    assert "s3cret-pw" not in repr(settings)
    assert nats_connect_options(settings)["servers"] == ["nats://a:4222", "nats://b:4222"]


def test_tls_is_on_with_a_ca_or_a_tls_url(tmp_path: Path) -> None:
    pki = make_dev_pki(tmp_path)
    with_ca = NatsAuth(
        tls_ca_file=str(pki.ca), tls_cert_file=str(pki.client_cert), tls_key_file=str(pki.client_key)
    )
    context = with_ca.connect_options()["tls"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.get_ca_certs()[0]["subject"] == ((("commonName", "toolbus dev CA"),),)
    assert NatsAuth(servers=["tls://n:4222"]).uses_tls
    named = NatsAuth(tls_ca_file=str(pki.ca), tls_server_name="nats.internal").connect_options()
    assert named["tls_hostname"] == "nats.internal"


def test_sentinels_and_jetstream_placement_from_settings() -> None:
    settings = Settings(
        redis_sentinels="10.0.0.1:26379, sentinel-b:26380,sentinel-c",
        js_replicas=3,
        js_storage="memory",
        js_events_max_age=3600,
        js_events_max_bytes=1 << 30,
    )
    assert settings.redis_sentinel_addresses == [
        ("10.0.0.1", 26379),
        ("sentinel-b", 26380),
        ("sentinel-c", 26379),
    ]
    assert Settings().redis_sentinel_addresses == []
    with pytest.raises(ValidationError, match="not host:port"):
        Settings(redis_sentinels="a:1,b:port")
    placement = JsPlacement.of(settings)
    assert (placement.replicas, placement.storage.value) == (3, "memory")
    limits = events_stream_limits(settings)
    assert limits["max_age"].total_seconds() == 3600 and limits["max_bytes"] == 1 << 30


def test_a_prefix_no_subject_can_be_built_under_is_refused_alike_by_sdk_and_services() -> None:
    from toolbus import Toolbus
    from toolbus._connection import ConnectOptions

    for bad in ("a b", "", "a..b", "a.*", "a.>", ".a", "a."):
        with pytest.raises(ValueError, match="subject prefix"):
            ConnectOptions.from_env({}, prefix=bad)
        with pytest.raises(ValueError, match="subject prefix"):
            Toolbus(None, bad)  # type: ignore[arg-type]  # refused before the connection is used
        with pytest.raises(ValidationError):
            Settings(subject_prefix=bad)
    for good in ("toolbus", "acme.prod-1", "t_2.x"):
        assert ConnectOptions.from_env({}, prefix=good).prefix == good
        assert Settings(subject_prefix=good).subject_prefix == good
