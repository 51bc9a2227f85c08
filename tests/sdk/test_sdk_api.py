"""The names the `toolbus` package exports are pinned (adding one is a decision, removing one a
breaking change), and connect options become the right nats-py arguments with no secret shown."""

from __future__ import annotations

import json
import ssl

import pytest
import toolbus
import toolbus.agent
from toolbus import ConnectOptions

EXPORTED = [
    "ERRORS",
    "Approvals",
    "CallContext",
    "CallHandle",
    "CallResult",
    "CallStatus",
    "Cancelled",
    "Conflict",
    "ConnectOptions",
    "Connection",
    "CredentialsRejected",
    "Denied",
    "ErrorCode",
    "HostNotAllowed",
    "HostTool",
    "Internal",
    "Backoff",
    "InvalidInput",
    "InvalidRequest",
    "Namespaces",
    "NotFound",
    "OutcomeUnknown",
    "OutputTooLarge",
    "Run",
    "Runs",
    "Timeout",
    "ToolError",
    "Toolbus",
    "ToolbusError",
    "Toolset",
    "Toolsets",
    "Unavailable",
    "UnknownTool",
    "UpstreamError",
    "UpstreamUnreachable",
    "Worker",
    "Workflows",
    "host_tool",
]


def test_the_exported_names_are_pinned() -> None:
    assert sorted(toolbus.__all__) == sorted(EXPORTED)
    for name in EXPORTED:
        assert getattr(toolbus, name) is not None
    public = {n for n in dir(toolbus.agent) if not n.startswith("_") and n[0].isupper()}
    assert {"AgentTools", "ToolDefinition", "SEARCH_TOOLS", "CALL_TOOL", "DEFINITIONS"} <= public


def test_the_errors_are_the_contract_hierarchy_not_a_second_one() -> None:
    import toolbus_contracts.errors as contract

    assert toolbus.ToolbusError is contract.ToolbusError
    assert toolbus.OutcomeUnknown is contract.OutcomeUnknown


ENVS = [
    {},
    {
        "TOOLBUS_NATS_URL": "nats://a:4222,nats://b:4222",
        "TOOLBUS_NATS_USER": "harness",
        "TOOLBUS_NATS_PASSWORD": "pw",
    },
    {"TOOLBUS_NATS_TOKEN": "tok", "TOOLBUS_NATS_INBOX_PREFIX": "_INBOX_harness"},
    {"TOOLBUS_NATS_CREDS_FILE": "/x/h.creds", "TOOLBUS_NATS_TOKEN": "ignored: creds first"},
    {"TOOLBUS_NATS_NKEY_FILE": "/x/seed.nk", "TOOLBUS_NATS_USER": "ignored: nkey first"},
    {"TOOLBUS_NATS_URL": "tls://n:4222", "TOOLBUS_NATS_TLS_SERVER_NAME": "nats.internal"},
]


@pytest.mark.parametrize("env", ENVS)
def test_connect_options_give_nats_py_what_the_services_builder_gives(env: dict[str, str]) -> None:
    from toolbus_nats_connect import NatsAuth

    ours = ConnectOptions.from_env(env).nats_kwargs()
    theirs = NatsAuth.from_env(env).connect_options()
    for kwargs in (ours, theirs):
        if "tls" in kwargs:
            assert isinstance(kwargs.pop("tls"), ssl.SSLContext)
    assert {k: v for k, v in ours.items() if k not in ("name", "connect_timeout")} == theirs


def test_connect_options_from_env_and_overrides() -> None:
    env = {
        "TOOLBUS_SUBJECT_PREFIX": "acme",
        "TOOLBUS_NATS_USER": "harness",
        "TOOLBUS_NATS_PASSWORD": "pw-secret-1",
    }
    opts = ConnectOptions.from_env(env)
    assert opts.prefix == "acme" and opts.nats_url == "nats://127.0.0.1:4222"
    assert "pw-secret-1" not in repr(opts)
    token = ConnectOptions.from_env({}, token="tok-1", nats_url="nats://c:1", prefix="p").nats_kwargs()
    assert token["token"] == "tok-1" and token["servers"] == ["nats://c:1"] and "user" not in token
    with pytest.raises(TypeError, match="unknown connect option"):
        ConnectOptions.from_env({}, nope=1)


def test_tls_options_build_an_ssl_context() -> None:
    import certifi

    opts = ConnectOptions.from_env({"TOOLBUS_NATS_TLS_CA_FILE": certifi.where()})
    context = opts.nats_kwargs()["tls"]
    assert isinstance(context, ssl.SSLContext) and context.verify_mode is ssl.CERT_REQUIRED
    assert "tls" not in ConnectOptions().nats_kwargs()


def test_the_sdk_and_cli_import_no_service_runtime() -> None:
    """The SDK shares the services' connection builder (`toolbus_nats_connect`) without loading
    their runtime: `toolbus_common` brings Redis, FastStream and Starlette (~1 s per CLI start)."""
    import subprocess
    import sys

    code = (
        "import json, sys, toolbus, toolbus.cli; roots = ('toolbus_common', 'redis', 'faststream', "
        "'starlette', 'toolbus_nats_connect'); print(json.dumps(sorted(m for m in sys.modules if "
        "m.split('.')[0] in roots)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [
        "toolbus_nats_connect",
        "toolbus_nats_connect.auth",
        "toolbus_nats_connect.flush",
    ]
