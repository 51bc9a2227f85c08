"""`toolsets.namespaces`, scoped `toolsets.search` and one namespace's declarations, through a real
registry on real NATS against real MCP servers: where each summary comes from (the server's own
instructions or title, the user's description, the tools), that a scoped search only ever
answers with tools of its scope, and that names the toolset does not have are refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common import Settings
from toolbus_contracts import Subjects
from toolbus_registry.app import RegistryApp

from tests.support.infra import request
from tests.support.mcp_servers import McpTestServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def _tools(names: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "description": text,
            "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}},
        }
        for name, text in names.items()
    ]


ISSUES = {
    "create_issue": "Open a new issue in a repository.",
    "list_issues": "List the issues of a repository.",
    "update_issue": "Change an issue's title, body or state (close or reopen it).",
    "add_comment": "Comment on an issue.",
}
MAIL = {
    "send_message": "Send an email message to a recipient.",
    "list_messages": "List the messages of a mailbox.",
    "delete_message": "Delete one email message.",
}
FILES = {
    "read_file": "Read a file's text.",
    "write_file": "Write text to a file.",
    "list_directory": "List a directory's entries.",
    "delete_file": "Delete one file.",
}


@pytest.fixture(scope="module")
def settings(service_env: dict[str, str]) -> Settings:
    env: dict[str, Any] = {k.removeprefix("TOOLBUS_").lower(): v for k, v in service_env.items()}
    return Settings(**env)


@pytest.fixture(scope="module")
def subjects(settings: Settings) -> Subjects:
    return settings.subjects


class _NoCredentials:
    async def set_toolset(self, toolset_id: str, credentials: Any) -> None:  # pragma: no cover
        raise AssertionError("these toolsets carry no credentials")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def registry(settings: Settings) -> AsyncIterator[RegistryApp]:
    app = RegistryApp(settings, credentials=_NoCredentials())
    await app.start()
    yield app
    await app.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def servers() -> AsyncIterator[dict[str, McpTestServer]]:
    started = {
        "tracker": McpTestServer(
            _tools(ISSUES),
            name="tracker",
            instructions="Issue tracker of the team's repositories. Call list_issues before update_issue.",
        ),
        "mail": McpTestServer(_tools(MAIL), name="mail", title="Company mail"),
        "files": McpTestServer(_tools(FILES), name="files"),
        "notes": McpTestServer(_tools({"add_note": "Add a note."}), name="notes"),
    }
    for s in started.values():
        await s.start()
    yield started
    for s in started.values():
        await s.stop()


async def _toolset(nc: Any, subjects: Subjects, servers: dict[str, McpTestServer], **extra: Any) -> str:
    body = {
        "mcp": [
            {"name": "tracker", "url": servers["tracker"].url},
            {"name": "mail", "url": servers["mail"].url},
            {"name": "files", "url": servers["files"].url},
            {"name": "notes", "url": servers["notes"].url, "description": "The user's own notes."},
        ],
        "host": [
            {
                "name": "crm.find_customer",
                "description": "Find a customer.",
                "inputSchema": {"type": "object"},
            },
            {
                "name": "crm.update_customer",
                "description": "Change a customer.",
                "inputSchema": {"type": "object"},
            },
            {
                "name": "ask_user",
                "description": "Ask the end user a question.",
                "inputSchema": {"type": "object"},
            },
        ],
        "http": {"allow": ["example.com"]},
        **extra,
    }
    created = await request(nc, subjects.toolsets_create, body, timeout=30)
    assert created["ok"], created
    return str(created["data"]["id"])


async def test_namespaces_give_kind_count_and_where_each_summary_comes_from(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    tid = await _toolset(nc, subjects, servers)
    reply = await request(nc, subjects.toolsets_namespaces, {"id": tid})
    assert reply["ok"], reply
    assert "nextCursor" not in reply["data"]
    got = {n["name"]: n for n in reply["data"]["namespaces"]}
    assert list(got) == sorted(got)
    assert {k: (v["kind"], v["toolCount"], v["summarySource"]) for k, v in got.items()} == {
        "ask_user": ("host", 1, "derived"),
        "crm": ("host", 2, "derived"),
        "files": ("mcp", 4, "derived"),
        "http": ("http", 1, "derived"),
        "mail": ("mcp", 3, "server"),
        "notes": ("mcp", 1, "user"),
        "tracker": ("mcp", 4, "server"),
    }
    # The server's instructions, first sentence; its title where it has no instructions.
    assert got["tracker"]["summary"] == "Issue tracker of the team's repositories."
    assert got["mail"]["summary"] == "Company mail"
    assert got["notes"]["summary"] == "The user's own notes."
    # Derived: the actions and the resources of the tools' names.
    assert got["files"]["summary"] == "list, get, delete: file, directory, write file"
    assert got["crm"]["summary"] == "update: customer, find customer"
    assert got["ask_user"]["summary"] == "Ask the end user a question."
    unknown = await request(nc, subjects.toolsets_namespaces, {"id": "ts_" + "3" * 64})
    assert unknown["ok"] is False and unknown["error"]["code"] == "notFound"


async def test_the_user_description_is_part_of_the_toolset_id(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    plain = await _toolset(nc, subjects, servers)
    body = {"mcp": [{"name": "notes", "url": servers["notes"].url, "description": "Something else."}]}
    other = await request(nc, subjects.toolsets_create, body, timeout=30)
    same = await request(nc, subjects.toolsets_create, body, timeout=30)
    assert other["ok"] and same["ok"]
    assert other["data"]["id"] == same["data"]["id"] != plain
    listed = await request(nc, subjects.toolsets_namespaces, {"id": other["data"]["id"]})
    assert [(n["name"], n["summary"], n["summarySource"]) for n in listed["data"]["namespaces"]] == [
        ("notes", "Something else.", "user")
    ]


async def test_a_scoped_search_answers_only_with_tools_of_its_scope(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    tid = await _toolset(nc, subjects, servers)
    queries = ["delete", "list", "send an email", "close an issue", "customer", "read a file", "note"]
    for scope in (["mail"], ["tracker", "files"], ["crm", "ask_user", "http"], ["notes"]):
        for query in queries:
            found = await request(
                nc, subjects.toolsets_search, {"id": tid, "query": query, "limit": 50, "namespaces": scope}
            )
            assert found["ok"], found
            hits = found["data"]["tools"]
            assert {h["namespace"] for h in hits} <= set(scope), (scope, query, hits)
            assert all(
                h["name"] == h["namespace"] or h["name"].startswith(h["namespace"] + ".") for h in hits
            )
            assert found["data"]["ranking"] in ("lexical", "partial", "hybrid")
    both = await request(
        nc,
        subjects.toolsets_search,
        {"id": tid, "query": "delete", "limit": 10, "namespaces": ["mail", "files"]},
    )
    assert {h["name"] for h in both["data"]["tools"]} >= {"mail.delete_message", "files.delete_file"}
    unscoped = await request(nc, subjects.toolsets_search, {"id": tid, "query": "delete", "limit": 50})
    assert {h["namespace"] for h in unscoped["data"]["tools"]} >= {"mail", "files"}
    assert unscoped["data"]["tools"][0]["namespace"] in {"mail", "files", "tracker"}


async def test_unknown_namespaces_are_refused_naming_the_field(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    tid = await _toolset(nc, subjects, servers)
    cases: list[tuple[str, dict[str, Any], str]] = [
        (
            subjects.toolsets_search,
            {"id": tid, "query": "x", "namespaces": ["mail", "nope"]},
            "namespaces[1]",
        ),
        (subjects.toolsets_search, {"id": tid, "query": "x", "namespaces": ["nope"]}, "namespaces[0]"),
        (subjects.toolsets_search, {"id": tid, "query": "x", "namespaces": []}, "namespaces"),
        (subjects.toolsets_declarations, {"id": tid, "format": "prompt", "namespace": "nope"}, "namespace"),
    ]
    for subject, body, field in cases:
        reply = await request(nc, subject, body)
        assert reply["ok"] is False and reply["error"]["code"] == "invalidRequest", (body, reply)
        assert reply["error"]["details"]["field"] == field, reply


async def test_one_namespace_reads_as_its_own_prompt_lines(
    nc: Any, subjects: Subjects, registry: RegistryApp, servers: dict[str, McpTestServer]
) -> None:
    tid = await _toolset(nc, subjects, servers)
    reply = await request(
        nc, subjects.toolsets_declarations, {"id": tid, "format": "prompt", "namespace": "mail"}
    )
    assert reply["ok"], reply
    lines = reply["data"]["text"].splitlines()
    assert [line.split("(")[0] for line in lines] == [
        "mail.delete_message",
        "mail.list_messages",
        "mail.send_message",
    ]
    dts = await request(nc, subjects.toolsets_declarations, {"id": tid, "format": "dts", "namespace": "crm"})
    assert dts["ok"] and "find_customer" in dts["data"]["text"] and "send_message" not in dts["data"]["text"]
