"""The registry against real NATS (JetStream) and real MCP servers over streamable HTTP: every rule
of the contract's Registry section, content addressing, paging and restarts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common import Settings
from toolbus_contracts import Subjects
from toolbus_contracts.base import SCHEMA_DEPTH_MAX
from toolbus_registry.app import RegistryApp
from toolbus_registry.paging import ENVELOPE_SLACK
from toolbus_registry.pinning import TOOL_INFO_ROOM

from tests.support.infra import request, until
from tests.support.mcp_servers import (
    McpTestServer,
    echo_server,
    paging_server,
    synthetic_server,
    synthetic_tools,
    token_server,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

TOKEN = "reg-t0ken-9f2c4e1a"


@pytest.fixture(scope="module")
def settings(service_env: dict[str, str]) -> Settings:
    env: dict[str, Any] = {k.removeprefix("TOOLBUS_").lower(): v for k, v in service_env.items()}
    return Settings(**env)


@pytest.fixture(scope="module")
def subjects(settings: Settings) -> Subjects:
    return settings.subjects


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def registry(settings: Settings) -> AsyncIterator[RegistryApp]:
    """The registry, with the credentials service that stores registration's credentials."""
    from toolbus_credentials.app import CredentialsService

    credentials = CredentialsService(settings)
    await credentials.start()
    app = RegistryApp(settings)
    await app.start()
    yield app
    await app.stop()
    await credentials.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def servers() -> AsyncIterator[dict[str, McpTestServer]]:
    started = {
        "echo": echo_server(),
        "paged": paging_server(n=8, page_size=3),
        "locked": token_server(TOKEN),
        "big": synthetic_server(100),
    }
    for s in started.values():
        await s.start()
    yield started
    for s in started.values():
        await s.stop()


async def create(nc: Any, subjects: Subjects, body: Any, timeout: float = 20) -> dict[str, Any]:
    return await request(nc, subjects.toolsets_create, body, timeout=timeout)


def assert_error(reply: dict[str, Any], code: str, *names: str) -> None:
    assert reply["ok"] is False, reply
    assert reply["error"]["code"] == code, reply
    for name in names:
        assert name in reply["error"]["message"], (name, reply["error"]["message"])


async def test_create_pins_every_tool_with_effective_policies(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    body = {
        "mcp": [
            {
                "name": "echo",
                "url": servers["echo"].url,
                "policies": {"echo": {"onInterruption": "at_most_once"}},
            }
        ],
        "host": [
            {
                "name": "crm.find_customer",
                "description": "Find a customer.",
                "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
                "policy": {"heartbeatTimeout": "30s", "concurrency": 2},
            }
        ],
        "http": {"allow": ["api.github.com", "*.example.com"]},
    }
    reply = await create(nc, subjects, body)
    assert reply["ok"], reply
    data = reply["data"]
    assert data["id"].startswith("ts_") and len(data["id"]) == 67
    tools = {t["name"]: t for t in data["tools"]}
    assert set(tools) >= {"echo.echo", "crm.find_customer", "http.fetch"}
    assert tools["echo.echo"]["kind"] == "mcp"
    assert tools["echo.echo"]["policy"] == {
        "onInterruption": "at_most_once",
        "approval": False,
        "timeout": "5m",
        "heartbeatTimeout": "60s",
        "concurrency": None,
    }
    assert tools["crm.find_customer"]["kind"] == "host"
    assert tools["crm.find_customer"]["policy"] == {
        "onInterruption": "retry",
        "approval": False,
        "timeout": None,
        "heartbeatTimeout": "30s",
        "concurrency": 2,
    }
    assert tools["http.fetch"]["policy"]["timeout"] == "5m"
    assert data["declarations"]["prompt"] and data["declarations"]["dts"]

    got = await request(nc, subjects.toolsets_get, {"id": data["id"]})
    assert got["ok"] and got["data"]["tools"] == data["tools"] and "declarations" not in got["data"]


async def test_paged_tools_list_is_followed_to_the_end(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    reply = await create(nc, subjects, {"mcp": [{"name": "paged", "url": servers["paged"].url}]})
    assert reply["ok"], reply
    names = sorted(t["name"] for t in reply["data"]["tools"])
    assert len(names) == 8 and names == sorted(f"paged.{t['name']}" for t in servers["paged"].tools)


async def test_same_toolset_in_another_order_gets_the_same_id(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    host = [
        {"name": "a_tool", "inputSchema": {"type": "object"}},
        {"name": "b_tool", "inputSchema": {"type": "object"}},
    ]
    one: dict[str, Any] = {
        "mcp": [{"name": "echo", "url": servers["echo"].url}, {"name": "paged", "url": servers["paged"].url}],
        "host": host,
        "http": {"allow": ["a.example.com", "b.example.com"]},
    }
    two = {
        "http": {"allow": ["b.example.com", "a.example.com"]},
        "host": list(reversed(host)),
        "mcp": list(reversed(one["mcp"])),
    }
    first, second = await create(nc, subjects, one), await create(nc, subjects, two)
    assert first["ok"] and second["ok"]
    assert first["data"]["id"] == second["data"]["id"]


async def test_credentials_are_not_part_of_the_id_and_unlock_a_locked_server(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    spec = {"mcp": [{"name": "locked", "url": servers["locked"].url}]}
    refused = await create(nc, subjects, spec)
    assert_error(refused, "credentialsRejected", "locked")
    assert TOKEN not in json.dumps(refused)

    with_token = {
        **spec,
        "credentials": {"servers": {"locked": {"headers": {"Authorization": f"Bearer {TOKEN}"}}}},
    }
    first = await create(nc, subjects, with_token)
    assert first["ok"], first
    other = {
        **spec,
        "credentials": {
            "servers": {"locked": {"headers": {"Authorization": f"Bearer {TOKEN}", "X-Extra": "1"}}}
        },
    }
    second = await create(nc, subjects, other)
    assert second["ok"] and second["data"]["id"] == first["data"]["id"]
    assert TOKEN not in json.dumps(first) + json.dumps(second)

    # Registration's credentials landed at the toolset level, encrypted.
    from toolbus_common.credential_store import CredentialStore
    from toolbus_common.keys import Keys
    from toolbus_common.secrets import Cipher

    assert registry.service is not None
    settings = registry.settings
    from redis.asyncio import Redis

    redis: Redis[bytes] = Redis.from_url(settings.redis_url)
    try:
        store = CredentialStore(redis, Keys(settings.key_prefix), Cipher.from_settings(settings))
        resolved = await store.resolve(
            toolset_id=first["data"]["id"], namespace=None, run_id=None, server="locked"
        )
        assert resolved.level == "toolset"
        assert resolved.headers == {"Authorization": f"Bearer {TOKEN}", "X-Extra": "1"}
        raw = await redis.get(store.key("toolset", toolset_id=first["data"]["id"]))
        assert raw is not None and TOKEN.encode() not in raw
    finally:
        await redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag


async def test_a_server_whose_tools_changed_gets_another_id(
    nc: Any, subjects: Subjects, registry: RegistryApp
) -> None:
    async with McpTestServer(tools=synthetic_tools(3)) as server:
        spec = {"mcp": [{"name": "svc", "url": server.url}]}
        before = await create(nc, subjects, spec)
        server.tools = synthetic_tools(4)
        after = await create(nc, subjects, spec)
    assert before["ok"] and after["ok"]
    assert before["data"]["id"] != after["data"]["id"]


async def test_unreachable_server_is_named(nc: Any, subjects: Subjects, registry: RegistryApp) -> None:
    from tests.support.infra import free_port

    reply = await create(
        nc, subjects, {"mcp": [{"name": "ghost", "url": f"http://127.0.0.1:{free_port()}/mcp"}]}
    )
    assert_error(reply, "upstreamUnreachable", "ghost")


@pytest.mark.parametrize(
    ("body", "code", "named"),
    [
        ({"mcp": [{"name": "1bad", "url": "http://x/mcp"}]}, "invalidRequest", ["mcp[0].name"]),
        ({"mcp": [{"name": "http", "url": "http://x/mcp"}]}, "invalidRequest", ["mcp[0].name", "reserved"]),
        ({"mcp": [{"name": "workflows", "url": "http://x/mcp"}]}, "invalidRequest", ["reserved"]),
        ({"mcp": [{"name": "ftp", "url": "ftp://x/mcp"}]}, "invalidRequest", ["ftp"]),
        ({"mcp": [{"name": "ctl", "url": "http://x/m\ncp"}]}, "invalidRequest", ["mcp[0].url", "control"]),
        ({"mcp": [{"name": "sp", "url": "http://x/a b"}]}, "invalidRequest", ["mcp[0].url", "whitespace"]),
        ({"mcp": [{"name": "port", "url": "http://x:99999/mcp"}]}, "invalidRequest", ["mcp[0].url", "port"]),
        ({"mcp": [{"name": "v6", "url": "http://[::1:3001/mcp"}]}, "invalidRequest", ["mcp[0].url", "IPv6"]),
        (
            {"mcp": [{"name": "ui", "url": "http://u:pass-w0rd@127.0.0.1:1/mcp"}]},
            "invalidRequest",
            ["mcp[0].url", "user info", "credentials"],
        ),
        (
            {"mcp": [{"name": "long", "url": "http://x/" + "a" * 900_000}]},
            "invalidRequest",
            ["mcp[0].url", "longer than 2048"],
        ),
        (
            {"host": [{"name": "a.b.c", "inputSchema": {"type": "object"}}]},
            "invalidRequest",
            ["host[0].name"],
        ),
        (
            {"host": [{"name": "crm.9x", "inputSchema": {"type": "object"}}]},
            "invalidRequest",
            ["host[0].name"],
        ),
        ({"host": [{"name": "http.get", "inputSchema": {"type": "object"}}]}, "invalidRequest", ["reserved"]),
        ({"host": [{"name": "t"}]}, "invalidRequest", ["host[0].inputSchema"]),
        (
            {"host": [{"name": "t", "inputSchema": {"type": "nope"}}]},
            "invalidRequest",
            ["host[0].inputSchema"],
        ),
        (
            {"host": [{"name": "t", "inputSchema": {"type": "object"}, "outputSchema": {"properties": 3}}]},
            "invalidRequest",
            ["host[0].outputSchema"],
        ),
        (
            {
                "host": [
                    {"name": "t", "inputSchema": {"type": "object"}},
                    {"name": "t", "inputSchema": {"type": "object"}},
                ]
            },
            "invalidRequest",
            ["'t'"],
        ),
        (
            {"host": [{"name": "t", "inputSchema": {}, "policy": {"timeout": "0s"}}]},
            "invalidRequest",
            ["timeout"],
        ),
        (
            {"host": [{"name": "t", "inputSchema": {}, "policy": {"concurrency": 17}}]},
            "invalidRequest",
            ["concurrency"],
        ),
        (
            {"host": [{"name": "t", "inputSchema": {}, "policy": {"onInterruption": "never"}}]},
            "invalidRequest",
            ["onInterruption"],
        ),
        ({"workflows": ["no_such_flow"]}, "notFound", ["no_such_flow"]),
        ({"workflows": ["bad name"]}, "invalidRequest", ["workflows[0]"]),
        ({"base": "ts_" + "0" * 64}, "notFound", ["ts_" + "0" * 64]),
        ({"base": "ts_nope"}, "invalidRequest", ["base"]),
        ({"bogus": 1}, "invalidRequest", ["bogus"]),
        ({"mcp": "github"}, "invalidRequest", ["mcp"]),
        ([1, 2], "invalidRequest", []),
    ],
)
async def test_bad_specs_get_a_clear_error(
    nc: Any, subjects: Subjects, registry: RegistryApp, body: Any, code: str, named: list[str]
) -> None:
    reply = await create(nc, subjects, body)
    assert_error(reply, code, *named)
    assert "pass-w0rd" not in json.dumps(reply)  # a URL's password is never quoted back


async def test_malformed_json_gets_invalid_request(
    nc: Any, subjects: Subjects, registry: RegistryApp
) -> None:
    nan = b'{"host": [{"name": "a", "inputSchema": {"type": "object", "default": NaN}}]}'
    for raw in (b"{", b"", b"null", b'{"mcp": [}', nan, nan.replace(b"NaN", b"-Infinity")):
        reply = await request(nc, subjects.toolsets_create, raw)
        assert_error(reply, "invalidRequest")


async def test_duplicate_qualified_name_across_kinds(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    body = {
        "mcp": [{"name": "echo", "url": servers["echo"].url}],
        "host": [{"name": "echo.echo", "inputSchema": {"type": "object"}}],
    }
    reply = await create(nc, subjects, body)
    assert_error(reply, "invalidRequest", "echo.echo")
    assert reply["error"]["details"] == {"field": "host[0].name", "tool": "echo.echo"}
    twice = {"host": [{"name": n, "inputSchema": {"type": "object"}} for n in ("a.b", "c", "a.b")]}
    reply = await create(nc, subjects, twice)
    assert_error(reply, "invalidRequest", "a.b")
    assert reply["error"]["details"] == {"field": "host[2].name", "tool": "a.b"}


async def test_duplicate_server_name(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    url = servers["echo"].url
    body = {"mcp": [{"name": "echo", "url": url}, {"name": "echo", "url": url}]}
    reply = await create(nc, subjects, body)
    assert_error(reply, "invalidRequest", "echo")
    assert reply["error"]["details"]["field"] == "mcp[1].name"


async def test_policy_for_a_tool_the_server_does_not_list(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    body = {
        "mcp": [{"name": "echo", "url": servers["echo"].url, "policies": {"delete_all": {"approval": True}}}]
    }
    assert_error(await create(nc, subjects, body), "invalidRequest", "delete_all", "echo")


async def test_credentials_for_a_server_the_toolset_lacks(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    body = {
        "mcp": [{"name": "echo", "url": servers["echo"].url}],
        "credentials": {"servers": {"github": {"headers": {"Authorization": "Bearer x-y-z"}}}},
    }
    reply = await create(nc, subjects, body)
    assert_error(reply, "invalidRequest", "github")
    assert "x-y-z" not in json.dumps(reply)


async def test_a_workflow_with_a_number_that_cannot_be_written_back_is_refused(
    nc: Any, subjects: Subjects, registry: RegistryApp
) -> None:
    head = b'{"name": "wbig", "inputSchema": {"type": "object"}, "definition": '
    for tail, field in (
        (b'{"x": [123456789012345678901234567890]}}', "definition.x[0]"),
        (b'{"x": 1e400}}', "definition.x"),
    ):
        reply = await request(nc, subjects.workflows_publish, head + tail)
        assert_error(reply, "invalidRequest")
        assert reply["error"]["details"] == {"field": field}
    assert_error(await request(nc, subjects.workflows_get, {"name": "wbig"}), "notFound")


async def test_workflows_publish_get_and_pin(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    wf = {
        "name": "triage",
        "description": "Triage an issue.",
        "inputSchema": {"type": "object"},
        "definition": {"steps": [1]},
    }
    v1 = await request(nc, subjects.workflows_publish, wf)
    again = await request(nc, subjects.workflows_publish, wf)
    assert v1["ok"] and again["data"] == v1["data"]
    version1 = v1["data"]["version"]
    assert len(version1) == 12 and int(version1, 16) >= 0
    v2 = await request(nc, subjects.workflows_publish, {**wf, "definition": {"steps": [1, 2]}})
    version2 = v2["data"]["version"]
    assert version2 != version1

    latest = await request(nc, subjects.workflows_get, {"name": "triage"})
    assert latest["ok"] and latest["data"]["version"] == version2
    old = await request(nc, subjects.workflows_get, {"name": "triage", "version": version1})
    assert old["data"]["definition"] == {"steps": [1]}
    assert_error(
        await request(nc, subjects.workflows_get, {"name": "triage", "version": "0" * 12}), "notFound"
    )
    assert_error(await request(nc, subjects.workflows_get, {"name": "nothing"}), "notFound", "nothing")

    pinned_latest = await create(nc, subjects, {"workflows": ["triage"]})
    pinned_old = await create(nc, subjects, {"workflows": [f"triage@{version1}"]})
    assert pinned_latest["ok"] and pinned_old["ok"]
    assert pinned_latest["data"]["id"] != pinned_old["data"]["id"]
    assert [t["name"] for t in pinned_latest["data"]["tools"]] == ["workflows.triage"]
    assert_error(await create(nc, subjects, {"workflows": ["triage@" + "f" * 12]}), "notFound", "triage")

    # derive: keep the base's pins, re-pin a workflow; no listing happens again
    base = await create(
        nc,
        subjects,
        {"mcp": [{"name": "echo", "url": servers["echo"].url}], "workflows": [f"triage@{version1}"]},
    )
    derived = await create(nc, subjects, {"base": base["data"]["id"], "workflows": ["triage"]})
    assert derived["ok"], derived
    assert (
        derived["data"]["id"]
        == (
            await create(
                nc, subjects, {"mcp": [{"name": "echo", "url": servers["echo"].url}], "workflows": ["triage"]}
            )
        )["data"]["id"]
    )
    for field, value in (
        ("mcp", [{"name": "x", "url": "http://x/mcp"}]),
        ("host", [{"name": "t", "inputSchema": {}}]),
        ("http", {"allow": ["a.b"]}),
        ("http", {"allow": []}),  # not "empty": on a first registration, an http.fetch fetching nothing
    ):
        assert_error(
            await create(nc, subjects, {"base": base["data"]["id"], field: value}), "invalidRequest", field
        )
    # "absent or empty": empty lists derive the same toolset
    again = await create(
        nc, subjects, {"base": base["data"]["id"], "workflows": ["triage"], "mcp": [], "host": []}
    )
    assert again["ok"] and again["data"]["id"] == derived["data"]["id"], again


async def test_credentials_of_a_derived_toolset_name_only_the_bases_servers(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    """Checked before anything is stored, as on a first registration (before, the derived toolset
    was stored and only then did the credentials service refuse the unknown server)."""
    from toolbus_contracts import ToolsetCreateRequest

    base = (await create(nc, subjects, {"mcp": [{"name": "echo", "url": servers["echo"].url}]}))["data"]["id"]
    published = await request(nc, subjects.workflows_publish, {"name": "derived_creds", "inputSchema": {}})
    assert published["ok"], published
    derive = {"base": base, "workflows": ["derived_creds"]}
    assert registry.service is not None
    would_be = (await registry.service._pinner.pin(ToolsetCreateRequest.model_validate(derive))).id
    headers = {"headers": {"Authorization": "Bearer d-e-r-i-v-e-d"}}
    refused = await create(nc, subjects, {**derive, "credentials": {"servers": {"github": headers}}})
    assert_error(refused, "invalidRequest", "github")
    assert refused["error"]["details"] == {"field": "credentials.servers.github", "server": "github"}
    assert "d-e-r-i-v-e-d" not in json.dumps(refused)
    assert_error(await request(nc, subjects.toolsets_get, {"id": would_be}), "notFound")
    taken = await create(nc, subjects, {**derive, "credentials": {"servers": {"echo": headers}}})
    assert taken["ok"] and taken["data"]["id"] == would_be, taken


async def test_credentials_not_stored_for_want_of_the_service_are_unavailable_not_internal(
    nc: Any, settings: Settings, servers: dict[str, McpTestServer]
) -> None:
    """No credentials service answers: the reply is `unavailable` naming the service (the SDK
    sends it again; registering again is safe, same id), never `internal`, which means a bug;
    with none subscribed at all it says so (`noService`: the SDK then gives up after 5 s)."""
    from toolbus_registry.credentials import CredentialsServiceSink

    alone = Settings(**{**settings.model_dump(), "subject_prefix": f"{settings.subject_prefix}.alone"})
    nobody = CredentialsServiceSink(nc, Subjects(f"{settings.subject_prefix}.nobody"), timeout=2.0)
    app = RegistryApp(alone, credentials=nobody)  # its buckets are under the session's prefix
    await app.start()
    try:
        body = {
            "mcp": [{"name": "echo", "url": servers["echo"].url}],
            "credentials": {"servers": {"echo": {"headers": {"Authorization": "Bearer n-o-b"}}}},
        }
        reply = await create(nc, alone.subjects, body)
        assert_error(reply, "unavailable", "credentials service")
        details = reply["error"]["details"]
        assert details["service"] == "credentials" and details["noService"] is True
        assert "n-o-b" not in json.dumps(reply)
        # The toolset itself was stored: registering again (once the service runs) stores them.
        assert (await request(nc, alone.subjects.toolsets_get, {"id": details["toolsetId"]}))["ok"]
    finally:
        await app.stop()


async def test_a_workflow_too_large_to_be_read_back_is_refused_not_stored(
    nc: Any, subjects: Subjects, registry: RegistryApp
) -> None:
    """A workflow just under 1 MiB was stored, then every `workflows.get` of it was
    `outputTooLarge` (and a few bytes more were `internal`: the KV refused the entry)."""
    limit = nc.max_payload - ENVELOPE_SLACK
    for size in (1_048_400, 1_048_500):
        body = json.dumps({"name": "wlarge", "inputSchema": {}, "definition": "x" * size}).encode()
        reply = await request(nc, subjects.workflows_publish, body)
        assert_error(reply, "invalidRequest")
        assert reply["error"]["details"]["field"] == "body"
        assert reply["error"]["details"]["limit"] == limit and reply["error"]["details"]["size"] > limit
    assert_error(await request(nc, subjects.workflows_get, {"name": "wlarge"}), "notFound")
    fits = {"name": "wlarge", "inputSchema": {}, "definition": "x" * 1_040_000}
    assert (await request(nc, subjects.workflows_publish, fits))["ok"]
    got = await request(nc, subjects.workflows_get, {"name": "wlarge"})
    assert got["ok"] and got["data"]["definition"] == fits["definition"]


async def test_a_huge_key_in_a_spec_gets_a_small_error(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    """A policy key or a schema key was quoted whole (three times): replies of 15 kB to 700 kB."""
    policy = {"mcp": [{"name": "echo", "url": servers["echo"].url, "policies": {"k" * 5000: {}}}]}
    schema = {"host": [{"name": "h", "inputSchema": {"properties": {"q" * 700_000: {"type": 5}}}}]}
    for body in (policy, schema):
        msg = await nc.request(subjects.toolsets_create, json.dumps(body).encode(), timeout=20)
        reply = json.loads(msg.data)
        assert_error(reply, "invalidRequest")
        assert len(msg.data) < 2000, len(msg.data)


async def test_publish_refuses_invalid_schema(nc: Any, subjects: Subjects, registry: RegistryApp) -> None:
    reply = await request(nc, subjects.workflows_publish, {"name": "w", "inputSchema": {"type": 5}})
    assert_error(reply, "invalidRequest", "inputSchema")


def _nested(depth: int) -> bytes:
    """A JSON Schema nesting `depth` levels of objects: `{"items": {"items": ... {}}}`."""
    return b'{"items":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


async def test_a_schema_nested_too_deep_to_check_is_refused_naming_its_field(
    nc: Any, subjects: Subjects, registry: RegistryApp
) -> None:
    """Checking a schema nested ~130 levels exhausted Python's stack (`internal`, a 160 KB
    traceback logged); the deepest toolbus checks is `SCHEMA_DEPTH_MAX`."""
    for subject, head, tail, field in (
        (subjects.toolsets_create, b'{"host":[{"name":"h","inputSchema":', b"}]}", "host[0].inputSchema"),
        (
            subjects.toolsets_create,
            b'{"host":[{"name":"h","inputSchema":{},"outputSchema":',
            b"}]}",
            "host[0].outputSchema",
        ),
        (subjects.workflows_publish, b'{"name":"wdeep","inputSchema":', b"}", "inputSchema"),
        (
            subjects.workflows_publish,
            b'{"name":"wdeep","inputSchema":{},"outputSchema":',
            b"}",
            "outputSchema",
        ),
    ):
        for depth in (SCHEMA_DEPTH_MAX + 1, 130, 190):
            reply = await request(nc, subject, head + _nested(depth) + tail)
            assert_error(reply, "invalidRequest", field)
            assert reply["error"]["details"] == {"field": field, "limit": SCHEMA_DEPTH_MAX}
        assert (await request(nc, subject, head + _nested(SCHEMA_DEPTH_MAX) + tail))["ok"]


async def test_a_tool_larger_than_one_page_is_refused_and_a_large_one_reads_back(
    nc: Any, subjects: Subjects, registry: RegistryApp
) -> None:
    """One tool of ~1 MiB registered, then `toolsets.get` and `toolsets.search` of it were
    `outputTooLarge`: paging cannot split a tool."""
    limit = nc.max_payload - ENVELOPE_SLACK - TOOL_INFO_ROOM
    huge = {"name": "huge", "description": "d" * limit, "inputSchema": {"type": "object"}}
    reply = await create(nc, subjects, {"host": [{"name": "small", "inputSchema": {}}, huge]})
    assert_error(reply, "invalidRequest", "huge")
    details = reply["error"]["details"]
    assert (details["field"], details["tool"], details["limit"]) == ("host[1]", "huge", limit)
    server = McpTestServer(tools=[{**huge, "name": "listed_huge"}, *synthetic_tools(2)])
    await server.start()
    try:
        reply = await create(nc, subjects, {"mcp": [{"name": "big", "url": server.url}]}, timeout=30)
    finally:
        await server.stop()
    assert_error(reply, "invalidRequest", "listed_huge")
    assert reply["error"]["details"]["field"] == "mcp[0]" and reply["error"]["details"]["server"] == "big"

    # Under the limit: read back whole, and a search answers in one message.
    large = {**huge, "name": "large", "description": "search " * (limit // 7 - 200)}
    made = await create(nc, subjects, {"host": [large, {"name": "small", "inputSchema": {}}]})
    assert made["ok"], made
    page = await request(nc, subjects.toolsets_get, {"id": made["data"]["id"]}, timeout=10)
    assert page["ok"] and [t["name"] for t in page["data"]["tools"]] == ["large", "small"]
    msg = await nc.request(
        subjects.toolsets_search,
        json.dumps({"id": made["data"]["id"], "query": "search small", "limit": 5}).encode(),
        timeout=10,
    )
    found = json.loads(msg.data)
    assert found["ok"] and len(msg.data) <= nc.max_payload, found.get("error")
    assert sorted(t["name"] for t in found["data"]["tools"]) == ["large", "small"]


async def test_large_toolset_is_stored_whole_and_paged(
    nc: Any, subjects: Subjects, registry: RegistryApp
) -> None:
    # 1,500 tools of ~1 KB: more than one NATS message (1 MiB) even without declarations.
    servers = [McpTestServer(tools=synthetic_tools(150, prefix=f"s{i}")) for i in range(10)]
    await asyncio.gather(*(s.start() for s in servers))
    try:
        spec = {"mcp": [{"name": f"srv{i}", "url": s.url} for i, s in enumerate(servers)]}
        reply = await create(nc, subjects, spec, timeout=60)
    finally:
        await asyncio.gather(*(s.stop() for s in servers))
    assert reply["ok"], reply
    data = reply["data"]
    assert data["truncated"] is True and data["toolCount"] == 1500

    tools: list[dict[str, Any]] = []
    cursor = None
    pages = 0
    tools_cursor = None
    while True:
        body = {"id": data["id"], **({"cursor": cursor} if cursor else {})}
        page = await request(nc, subjects.toolsets_get, body, timeout=10)
        assert page["ok"], page
        tools.extend(page["data"]["tools"])
        pages += 1
        cursor = page["data"].get("nextCursor")
        tools_cursor = tools_cursor or cursor
        if cursor is None:
            break
    assert pages > 1 and len(tools) == 1500 and len({t["name"] for t in tools}) == 1500
    # A cursor pages only what it was given for: not the declarations of the same toolset.
    elsewhere = {"id": data["id"], "format": "dts", "cursor": tools_cursor}
    assert_error(await request(nc, subjects.toolsets_declarations, elsewhere), "invalidRequest", "cursor")

    for fmt in ("prompt", "dts"):
        text, cursor, pages = "", None, 0
        while True:
            body = {"id": data["id"], "format": fmt, **({"cursor": cursor} if cursor else {})}
            page = await request(nc, subjects.toolsets_declarations, body, timeout=30)
            assert page["ok"], page
            text += page["data"]["text"]
            pages += 1
            cursor = page["data"].get("nextCursor")
            if cursor is None:
                break
        assert ("srv9.s9_0149" if fmt == "prompt" else "s9_0149") in text
        if fmt == "prompt":
            assert len(text.splitlines()) == 1500


async def test_get_unknown_and_bad_cursor(nc: Any, subjects: Subjects, registry: RegistryApp) -> None:
    assert_error(await request(nc, subjects.toolsets_get, {"id": "ts_" + "1" * 64}), "notFound")
    assert_error(await request(nc, subjects.toolsets_get, {}), "invalidRequest", "id")
    for bad_id in ("ts_nope", "", "*", "x" * 900_000):  # never looked up: a store key of any size
        for subject, rest in (
            (subjects.toolsets_get, {}),
            (subjects.toolsets_search, {"query": "q"}),
            (subjects.toolsets_declarations, {"format": "dts"}),
        ):
            reply = await request(nc, subject, {"id": bad_id, **rest})
            assert_error(reply, "invalidRequest", "id")
            assert len(reply["error"]["message"]) < 200
    created = await create(nc, subjects, {"host": [{"name": "only", "inputSchema": {"type": "object"}}]})
    bad = await request(nc, subjects.toolsets_get, {"id": created["data"]["id"], "cursor": "%%%"})
    assert_error(bad, "invalidRequest", "cursor")


async def test_registered_toolset_survives_a_registry_restart(
    nc: Any, subjects: Subjects, settings: Settings, servers: dict[str, McpTestServer]
) -> None:
    first = RegistryApp(settings)
    await first.start()
    try:
        created = await create(nc, subjects, {"mcp": [{"name": "echo", "url": servers["echo"].url}]})
        assert created["ok"]
    finally:
        await first.stop()
    second = RegistryApp(settings)
    await second.start()
    try:
        got = await request(nc, subjects.toolsets_get, {"id": created["data"]["id"]})
    finally:
        await second.stop()
    assert got["ok"] and got["data"]["tools"] == created["data"]["tools"]


async def test_declarations_and_search_over_nats(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    created = await create(
        nc,
        subjects,
        {
            "mcp": [{"name": "echo", "url": servers["echo"].url}],
            "host": [
                {
                    "name": "crm.find_customer",
                    "description": "Find a customer by email address. Returns the customer record.",
                    "inputSchema": {
                        "type": "object",
                        "properties": {"email": {"type": "string"}},
                        "required": ["email"],
                    },
                },
                {
                    "name": "ask_user",
                    "description": "Ask the end user a question and wait for the answer.",
                    "inputSchema": {
                        "type": "object",
                        "properties": {"question": {"type": "string"}},
                        "required": ["question"],
                    },
                },
            ],
        },
    )
    assert created["ok"], created
    tid = created["data"]["id"]

    prompt = await request(nc, subjects.toolsets_declarations, {"id": tid, "format": "prompt"})
    assert prompt["ok"] and prompt["data"]["format"] == "prompt" and "nextCursor" not in prompt["data"]
    lines = prompt["data"]["text"].splitlines()
    assert [line.split("(")[0] for line in lines] == sorted(line.split("(")[0] for line in lines)
    assert any(line.startswith("crm.find_customer") and "email" in line for line in lines)
    assert prompt["data"]["text"] == created["data"]["declarations"]["prompt"]

    dts = await request(nc, subjects.toolsets_declarations, {"id": tid, "format": "dts"})
    assert dts["ok"] and 'declare module "rewind:tools"' in dts["data"]["text"]
    assert "export const crm" in dts["data"]["text"] and "ask_user" in dts["data"]["text"]
    again = await request(nc, subjects.toolsets_declarations, {"id": tid, "format": "dts"})
    assert again["data"]["text"] == dts["data"]["text"]

    found = await request(
        nc, subjects.toolsets_search, {"id": tid, "query": "look up a customer by their email", "limit": 2}
    )
    assert found["ok"], found
    hits = found["data"]["tools"]
    assert hits[0]["name"] == "crm.find_customer" and len(hits) <= 2
    assert hits[0]["prompt"].startswith("crm.find_customer") and "find_customer" in hits[0]["dts"]
    assert hits[0]["score"] >= hits[-1]["score"]

    for bad in (
        {"id": tid, "query": "x", "limit": 0},
        {"id": tid, "query": "x", "limit": 51},
        {"id": tid, "query": ""},
    ):
        assert_error(await request(nc, subjects.toolsets_search, bad), "invalidRequest")
    assert_error(
        await request(nc, subjects.toolsets_declarations, {"id": tid, "format": "yaml"}),
        "invalidRequest",
        "format",
    )
    assert_error(
        await request(nc, subjects.toolsets_search, {"id": "ts_" + "2" * 64, "query": "x"}), "notFound"
    )


async def test_integers_beyond_64_bits_are_pinned_as_the_doubles_the_id_takes_them_for(
    nc: Any, subjects: Subjects, registry: RegistryApp
) -> None:
    def spec(maximum: object) -> dict[str, Any]:
        schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": maximum}}}
        return {"host": [{"name": "big_limits", "inputSchema": schema}]}

    as_int = await request(nc, subjects.toolsets_create, json.dumps(spec(2**64)).encode())
    assert as_int["ok"], as_int
    as_float = await request(nc, subjects.toolsets_create, json.dumps(spec(float(2**64))).encode())
    assert as_float["data"]["id"] == as_int["data"]["id"]
    got = await request(nc, subjects.toolsets_get, {"id": as_int["data"]["id"]})
    assert got["data"]["tools"][0]["inputSchema"]["properties"]["n"]["maximum"] == float(2**64)


async def test_a_small_toolset_is_embedded_for_search_in_the_background(
    nc: Any, subjects: Subjects, registry: RegistryApp
) -> None:
    body = {
        "host": [{"name": "warm_me", "description": "A tool to warm.", "inputSchema": {"type": "object"}}]
    }
    created = await request(nc, subjects.toolsets_create, body)
    assert created["ok"] and "declarations" in created["data"]  # a reply that fits renders them
    tid = created["data"]["id"]
    assert registry.service is not None
    service = registry.service
    await until(lambda: tid in service._warmed, "the toolset to be warmed", limit=60)
