"""A harness on toolbus, start to end: run it against a running stack (`make up`, or any deployment
named by `TOOLBUS_NATS_URL` / `TOOLBUS_SUBJECT_PREFIX`) with `python examples/walkthrough.py`.

It registers a toolset of an MCP server (a small CRM, started here, behind a bearer token), a host
tool served by a worker in this process, and `http.fetch` for one local host; calls each; lets a
small refund through and approves a large one (an approval rule: 500 or more); rotates the CRM
token while a call is parked on the old one; and lets a scripted stand-in for a model read the
namespace catalogue, search one namespace, browse it and call a tool (`search_tools`,
`list_tools`, `call_tool`). No model or network needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import secrets
import threading
from typing import Any

from crm_server import CrmServer
from toolbus import CallContext, Toolbus, Worker, host_tool
from toolbus.agent import AgentTools


@host_tool(name="support.ask_user", policy={"onInterruption": "at_most_once"})
async def ask_user(question: str, ctx: CallContext) -> dict[str, str]:
    """Ask the end user a question (here: answered by a script)."""
    return {"answer": f"yes (asked on attempt {ctx.attempt})"}


def status_page() -> tuple[http.server.ThreadingHTTPServer, str]:
    """A local HTTP server for http.fetch to read."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"status": "all systems go"}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/status"


REFUND_RULE = {"when": {"properties": {"input": {"properties": {"amount": {"minimum": 500}}}}}}
"""Refunds of 500 or more wait for a person's decision; smaller ones go through."""


def bearer(token: str) -> dict[str, Any]:
    return {"servers": {"crm": {"headers": {"Authorization": f"Bearer {token}"}}}}


async def scripted_model(agent: AgentTools, task: str) -> Any:
    """Stands in for a model with Anthropic-style tool use: reads the namespace catalogue in
    `search_tools`' description, searches one namespace in the API's terms, browses it, calls."""
    tools = agent.anthropic()
    print(f"model   sees {len(tools)} tools: {[t['name'] for t in tools]}; task: {task!r}")
    catalogue = [line for line in tools[0]["description"].splitlines() if line.startswith("- ")]
    print("model   catalogue: " + "; ".join(catalogue))
    namespace = next(line[2:].split(" ")[0] for line in catalogue if "invoice" in line.lower())

    async def use(name: str, tool_input: dict[str, Any]) -> Any:
        block = {"type": "tool_use", "id": f"toolu_{name}", "name": name, "input": tool_input}
        return json.loads((await agent.answer_anthropic(block))["content"])

    found = await use("search_tools", {"query": "find invoice", "namespaces": [namespace], "limit": 3})
    best = found["tools"][0]["name"]
    print(f"model   search_tools in {[namespace]} -> {[t['name'] for t in found['tools']]}; picks {best}")
    listed = await use("list_tools", {"namespace": namespace})
    print(f"model   list_tools({namespace}) -> {listed['tools']}")
    answer = await use("call_tool", {"name": best, "input": {"invoice_id": "inv_1"}})
    print(f"model   call_tool({best}) -> {answer}")
    return answer


async def main() -> None:
    token = "tok-" + secrets.token_hex(8)
    crm = CrmServer(token).start()
    page, page_url = status_page()
    async with await Toolbus.connect() as tb:
        toolset = await tb.toolsets.create(
            mcp=[{"name": "crm", "url": crm.url, "policies": {"refund": {"approval": REFUND_RULE}}}],
            host=[ask_user],
            http={"allow": ["127.0.0.1"]},
            credentials=bearer(token),
        )
        print(f"toolset {toolset.id[:15]}… with {toolset.names}")
        if toolset.declarations:
            print("prompt  " + toolset.declarations.prompt.strip().replace("\n", "\n        "))

        async with Worker(tb, tools=[ask_user]), await tb.runs.open(toolset, namespace="user-42") as run:
            print(f"run     {run.id}")
            print("call    crm.find_invoice ->", await run.call("crm.find_invoice", {"invoice_id": "inv_1"}))
            print(
                "call    support.ask_user ->", await run.call("support.ask_user", {"question": "Refund it?"})
            )
            fetched = await run.call("http.fetch", {"url": page_url})
            print(f"call    http.fetch -> {fetched['status']} {fetched['body']}")

            small = await run.call("crm.refund", {"invoice_id": "inv_1", "amount": 100})
            print("call    crm.refund of 100, under the rule ->", small)
            # A refund of 500 or more needs approval: the request arrives, someone approves, the call goes on.
            requests = tb.approvals.requests(run_id=run.id)
            refund = await run.start("crm.refund", {"invoice_id": "inv_1", "amount": 1000})
            pending = await anext(requests)
            print(f"approval {pending.tool} {pending.input} waiting; approving")
            await tb.approvals.approve(pending.approval_id, reason="customer is right")
            print("call    crm.refund ->", await refund)
            await requests.aclose()

            # The token expires: the next call parks (no attempt spent) until new credentials come.
            expired = await tb.credentials_expired(toolset_id=toolset.id)
            crm.token = "tok-" + secrets.token_hex(8)
            parked = await run.start("crm.find_invoice", {"invoice_id": "inv_1"})
            notice = (await expired.next(timeout=60)).data
            await expired.close()
            print(
                f"parked  {len(notice.call_ids)} call on a 401 from {notice.server} ({notice.level} credentials); rotating"
            )
            await tb.toolsets.set_credentials(toolset, bearer(crm.token))
            print("call    crm.find_invoice after rotation ->", await parked.result(timeout=60))

            await scripted_model(await AgentTools.open(run), "look up an invoice")

            kinds: dict[str, int] = {}
            async for event in run.events(follow=False):
                kinds[event.type] = kinds.get(event.type, 0) + 1
            print(f"events  {kinds}")
        print("done    run closed")
    page.shutdown()
    with contextlib.suppress(Exception):
        crm.stop()


if __name__ == "__main__":
    asyncio.run(main())
