"""`toolbus`: the protocol from a shell. Every command takes `--json` (one JSON document on stdout;
errors as `{"ok": false, "error": {...}}`) and ends with an exit code a script can test:

\b
    0  success
    1  a bug (toolbus answered `internal`, or the CLI itself failed)
    2  usage: a bad option or argument, a file that cannot be read or parsed
    3  unavailable: NATS or a service did not answer (`unavailable`, `timeout`)
    4  not found: `notFound`, `unknownTool`
    5  refused: any other error (`invalidRequest`, `invalidInput`, `conflict`, ...), a spec's
       unknown or wrong field included
    6  the call ran and its outcome is an error (`calls invoke`; with `--json` the call's own
       reply, `{"callId", "idempotencyKey", "outcome": {"status": "error", "error"}}`)
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
import yaml
from pydantic import BaseModel
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from toolbus_contracts import check_prefix
from toolbus_contracts.base import unfit_number

from toolbus._client import Toolbus
from toolbus._connections import Connections
from toolbus._errors import ErrorCode, InvalidRequest, ToolbusError
from toolbus._toolsets import Toolset

EXIT_CODES: dict[str, int] = {
    "ok": 0,
    "bug": 1,
    "usage": 2,
    "unavailable": 3,
    "notFound": 4,
    "refused": 5,
    "callFailed": 6,
}

T = TypeVar("T")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

app = typer.Typer(
    name="toolbus",
    help=__doc__,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
toolsets_app = typer.Typer(help="Register, read, render and search toolsets.", no_args_is_help=True)
runs_app = typer.Typer(help="Open and close runs.", no_args_is_help=True)
calls_app = typer.Typer(help="Call tools of a run.", no_args_is_help=True)
approvals_app = typer.Typer(help="List and decide pending approvals.", no_args_is_help=True)
credentials_app = typer.Typer(
    help="Set credentials or connect OAuth accounts at the toolset, namespace or run level.",
    no_args_is_help=True,
)
events_app = typer.Typer(help="Read a run's call events.", no_args_is_help=True)
workflows_app = typer.Typer(help="Publish and read workflows.", no_args_is_help=True)
tokens_app = typer.Typer(help="Bearer tokens for the gateway's MCP endpoint.", no_args_is_help=True)
for sub, name in (
    (toolsets_app, "toolsets"),
    (runs_app, "runs"),
    (calls_app, "calls"),
    (approvals_app, "approvals"),
    (credentials_app, "credentials"),
    (events_app, "events"),
    (workflows_app, "workflows"),
    (tokens_app, "tokens"),
):
    app.add_typer(sub, name=name)


@dataclass
class Global:
    nats_url: str | None = None
    prefix: str | None = None
    timeout: float = 30.0
    json: bool = False


STATE = Global()

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document (errors too).")]


@app.callback()
def _root(
    nats_url: Annotated[
        str | None, typer.Option("--nats-url", envvar="TOOLBUS_NATS_URL", help="NATS URL.", show_envvar=True)
    ] = None,
    prefix: Annotated[
        str | None, typer.Option("--prefix", envvar="TOOLBUS_SUBJECT_PREFIX", help="Subject prefix.")
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", help="Seconds to wait for each reply (retries after unavailable included)."
        ),
    ] = 30.0,
    json_: JsonOpt = False,
) -> None:
    STATE.nats_url, STATE.prefix, STATE.timeout, STATE.json = nats_url, prefix, timeout, json_
    if not 0 < timeout < math.inf:  # NaN too
        _usage(json_, f"--timeout must be a finite number of seconds above 0, not {timeout}")
    if prefix is not None:
        try:
            check_prefix(prefix)
        except ValueError as exc:
            _usage(json_, f"--prefix / TOOLBUS_SUBJECT_PREFIX: {exc}")


# ---- output and errors -------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _emit(json_out: bool, data: Any, human: Callable[[], None] | None = None) -> None:
    if json_out or STATE.json or human is None:
        sys.stdout.write(json.dumps(_jsonable(data), indent=None if json_out or STATE.json else 2) + "\n")
        sys.stdout.flush()
    else:
        human()


def _exit_code(exc: ToolbusError) -> int:
    if exc.code in (ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT):
        return EXIT_CODES["unavailable"]
    if exc.code in (ErrorCode.NOT_FOUND, ErrorCode.UNKNOWN_TOOL):
        return EXIT_CODES["notFound"]
    if exc.code is ErrorCode.INTERNAL:
        return EXIT_CODES["bug"]
    return EXIT_CODES["refused"]


def _fail(json_out: bool, exc: ToolbusError, code: int) -> NoReturn:
    if json_out or STATE.json:
        sys.stdout.write(json.dumps({"ok": False, "error": exc.to_wire()}) + "\n")
    else:
        err.print(f"error: {exc.code.value}: {exc.message}", markup=False)
    raise typer.Exit(code)


def _usage(json_out: bool, message: str) -> NoReturn:
    if json_out or STATE.json:
        sys.stdout.write(json.dumps({"ok": False, "error": {"code": "usage", "message": message}}) + "\n")
    else:
        err.print(f"error: {message}", markup=False)
    raise typer.Exit(EXIT_CODES["usage"])


def _run(json_out: bool, work: Callable[[Toolbus], Awaitable[T]]) -> T:
    """Connect, run `work`, close; a `ToolbusError` becomes its one-line message and exit code."""

    async def go() -> T:
        async with await Toolbus.connect(STATE.nats_url, STATE.prefix, timeout=STATE.timeout) as tb:
            return await work(tb)

    try:
        return asyncio.run(go())
    except ToolbusError as exc:
        _fail(json_out, exc, _exit_code(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _carried(doc: Any, what: str, json_out: bool) -> Any:
    """`doc`, unless it holds a number no JSON carries: `NaN`, `Infinity` and `1e400`, which
    Python's JSON reader takes (the last as infinity), and YAML's `.nan` and `.inf`."""
    try:
        where = unfit_number(doc, ints=False)
    except InvalidRequest as exc:  # nests too deep to send
        _usage(json_out, f"{what} cannot be sent: {exc.message}")
    if where is not None:
        _usage(json_out, f"{what} is not JSON: it holds NaN or infinity, at {where}")
    return doc


def shorten(text: str, width: int) -> str:
    """`text` in at most `width` characters: cut at the last word that fits, with an ellipsis."""
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    if " " in cut and not text[width - 1].isspace():
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:.") + "…"


class AliasRefused(yaml.MarkedYAMLError):
    """A YAML alias (`*name`) in a file the CLI reads: refused, as no spec needs one and each
    can repeat a value (itself, or exponentially: "billion laughs")."""


class _NoAliasLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing aliases where it meets them."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            alias = self.peek_event()  # type: ignore[no-untyped-call]
            raise AliasRefused(
                problem=f"YAML aliases (*{getattr(alias, 'anchor', '')}) are not supported: write the value out",
                problem_mark=alias.start_mark,
            )
        return super().compose_node(parent, index)


def parse_error(path: str, exc: ValueError | yaml.YAMLError | RecursionError) -> str:
    """Where and why a JSON or YAML document does not parse: `path:line:column: problem`."""
    if isinstance(exc, RecursionError):
        return f"{path} nests too deep to read"
    if isinstance(exc, AliasRefused) and exc.problem_mark is not None:
        return f"{path}:{exc.problem_mark.line + 1}:{exc.problem_mark.column + 1}: {exc.problem}"
    if isinstance(exc, json.JSONDecodeError):
        return f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}"
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}"
    return f"{path} is not valid JSON or YAML: {str(exc).splitlines()[0]}"


def _load(path: str, json_out: bool) -> Any:
    """A JSON or YAML document from a file, or from stdin for `-`."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        _usage(json_out, f"cannot read {path}: {exc.strerror}")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        _usage(json_out, f"{path} is not UTF-8: byte {exc.start} is 0x{data[exc.start]:02x}")
    try:
        doc = json.loads(text) if path.endswith(".json") else yaml.load(text, _NoAliasLoader)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        _usage(json_out, parse_error(path, exc))
    return _carried(doc, path, json_out)


def _json_arg(text: str, what: str, json_out: bool) -> Any:
    if text.startswith("@"):
        return _load(text[1:], json_out)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        _usage(json_out, f"{what} is not JSON: {exc}")
    except RecursionError:
        _usage(json_out, f"{what} nests too deep to read")
    return _carried(doc, what, json_out)


def _print_json(value: Any) -> None:
    out.print_json(json.dumps(_jsonable(value)))


# ---- toolsets ----------------------------------------------------------------------------------


def _print_table(title: str, columns: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> None:
    """`rows` as a table under `title`, long cells folded."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    out.print(table)


def _approval_column(approval: object) -> str:
    return "yes" if approval is True else ("" if approval is False else "rule")


def _toolset_table(toolset: Toolset) -> None:
    _print_table(
        f"{toolset.id}  ({len(toolset.tools)} tools)",
        ("tool", "kind", "approval", "on interruption", "description"),
        (
            (
                tool.name,
                tool.kind,
                _approval_column(tool.policy.approval),
                tool.policy.on_interruption,
                shorten((tool.description or "").split(". ")[0], 80),
            )
            for tool in toolset.tools
        ),
    )


@toolsets_app.command("create")
def toolsets_create(
    file: Annotated[str, typer.Option("-f", "--file", help="toolset spec, .json or .yaml ('-' for stdin)")],
    json_: JsonOpt = False,
) -> None:
    """Register a toolset from a spec file (the body of toolsets.create)."""
    spec = _load(file, json_)
    if not isinstance(spec, dict):
        _usage(json_, f"{file} must hold one object (a toolset spec)")
    show = err.is_terminal  # on stderr: stdout stays one JSON document with --json

    async def work(tb: Toolbus) -> Toolset:
        servers = len(spec.get("mcp") or [])
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err,
            disable=not show,
        ) as progress:
            task = progress.add_task(
                f"registering {servers} MCP server(s): listing and pinning their tools", total=None
            )

            def step(stage: str, done: int, total: int | None) -> None:
                labels = {
                    "tools": f"reading tools: {done}" + (f" of {total}" if total else ""),
                    "prompt": f"reading prompt declarations: page {done}",
                    "dts": f"reading TypeScript declarations: page {done}",
                }
                if stage in labels:
                    progress.update(task, description=labels[stage])

            return await tb.toolsets.create(**_spec_kwargs(spec), progress=step)

    toolset = _run(json_, work)
    data = {"id": toolset.id, "tools": toolset.tools, "declarations": toolset.declarations}
    _emit(json_, data, lambda: _toolset_table(toolset))


def _spec_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as `toolsets.create`'s arguments. An unknown field is `invalidRequest` naming it,
    as the SDK and the service answer one nested deeper (exit 5, not a usage error)."""
    known = {"mcp", "host", "http", "workflows", "base", "credentials"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise InvalidRequest(
            f"Unknown field '{unknown[0]}': remove it (a spec has {', '.join(sorted(known))}).",
            details={"field": unknown[0]},
        )
    return {k: v for k, v in spec.items() if v is not None}


@toolsets_app.command("get")
def toolsets_get(toolset_id: str, json_: JsonOpt = False) -> None:
    """Show a registered toolset's tools and their effective policies."""
    toolset = _run(json_, lambda tb: tb.toolsets.get(toolset_id))
    _emit(json_, {"id": toolset.id, "tools": toolset.tools}, lambda: _toolset_table(toolset))


@toolsets_app.command("namespaces")
def toolsets_namespaces(toolset_id: str, json_: JsonOpt = False) -> None:
    """A toolset's namespaces: kind, tool count and a one-line summary of each."""
    found = _run(json_, lambda tb: tb.toolsets.namespaces(toolset_id))

    def human() -> None:
        _print_table(
            f"{toolset_id}  ({len(found)} namespaces)",
            ("namespace", "kind", "tools", "summary"),
            ((n.name, n.kind, str(n.tool_count), n.summary) for n in found),
        )

    _emit(json_, {"namespaces": found}, human)


@toolsets_app.command("search")
def toolsets_search(
    toolset_id: str,
    query: str,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=50)] = 5,
    namespace: Annotated[
        list[str] | None, typer.Option("--namespace", "-s", help="search only this namespace (repeatable)")
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """The tools of a toolset that best match a query, best first."""
    hits = _run(json_, lambda tb: tb.toolsets.search(toolset_id, query, limit, namespaces=namespace or None))

    def human() -> None:
        for hit in hits:
            out.print(f"{hit.score:6.3f}  {hit.prompt}", markup=False)

    _emit(json_, {"tools": hits}, human)


@toolsets_app.command("declarations")
def toolsets_declarations(
    toolset_id: str,
    format: Annotated[str, typer.Option("--format", help="prompt or dts")] = "prompt",
    namespace: Annotated[str | None, typer.Option("--namespace", "-s", help="only this namespace")] = None,
    json_: JsonOpt = False,
) -> None:
    """Print a toolset's declarations: `--format dts > tools.d.ts`."""
    if format not in ("prompt", "dts"):
        _usage(json_, f"--format must be prompt or dts, not {format!r}")
    text = _run(
        json_,
        lambda tb: tb.toolsets.declarations(toolset_id, format, namespace=namespace),  # type: ignore[arg-type]
    )

    def human() -> None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")

    _emit(json_, {"format": format, "text": text}, human)


# ---- runs and calls ----------------------------------------------------------------------------


@runs_app.command("open")
def runs_open(
    toolset_id: str,
    namespace: Annotated[str | None, typer.Option("--namespace", help="the end user's id")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id")] = None,
    json_: JsonOpt = False,
) -> None:
    """Open a run of a toolset; prints its run id."""
    run = _run(json_, lambda tb: tb.runs.open(toolset_id, namespace=namespace, run_id=run_id))
    _emit(json_, {"runId": run.id}, lambda: out.print(run.id, markup=False))


@runs_app.command("close")
def runs_close(run_id: str, json_: JsonOpt = False) -> None:
    """Close a run: unfinished calls end cancelled."""
    cancelled = _run(json_, lambda tb: tb.runs.attach(run_id).close())
    _emit(
        json_,
        {"runId": run_id, "cancelled": cancelled},
        lambda: out.print(f"closed {run_id}; {cancelled} call(s) cancelled"),
    )


InputOpt = Annotated[str, typer.Option("--input", "-i", help="the input as JSON, or @file (JSON/YAML)")]


@calls_app.command("invoke")
def calls_invoke(
    tool: str,
    run: Annotated[str, typer.Option("--run", help="run id")],
    input: InputOpt = "{}",
    key: Annotated[str | None, typer.Option("--key", help="idempotency key")] = None,
    json_: JsonOpt = False,
) -> None:
    """Call a tool and wait for its outcome; prints the output (exit 6 when the call failed)."""
    body = _json_arg(input, "--input", json_)
    if not isinstance(body, dict):
        _usage(json_, "--input must be a JSON object")
    result = _run(
        json_, lambda tb: tb.runs.attach(run).invoke(tool, body, idempotency_key=key, timeout=STATE.timeout)
    )
    if result.error is not None:
        if json_ or STATE.json:
            wire = {"status": "error", "error": result.error.to_wire()}
            sys.stdout.write(
                json.dumps(
                    {"callId": result.call_id, "idempotencyKey": result.idempotency_key, "outcome": wire}
                )
                + "\n"
            )
        else:
            err.print(
                f"error: {result.error.code.value}: {result.error.message} (call {result.call_id})",
                markup=False,
            )
        raise typer.Exit(EXIT_CODES["callFailed"])
    data = {
        "callId": result.call_id,
        "idempotencyKey": result.idempotency_key,
        "outcome": {"status": "ok", "output": result.output},
    }
    _emit(json_, data, lambda: _print_json(result.output))


@calls_app.command("start")
def calls_start(
    tool: str,
    run: Annotated[str, typer.Option("--run", help="run id")],
    input: InputOpt = "{}",
    key: Annotated[str | None, typer.Option("--key", help="idempotency key")] = None,
    json_: JsonOpt = False,
) -> None:
    """Start a call without waiting; prints its call id."""
    body = _json_arg(input, "--input", json_)
    if not isinstance(body, dict):
        _usage(json_, "--input must be a JSON object")
    handle = _run(json_, lambda tb: tb.runs.attach(run).start(tool, body, idempotency_key=key))
    _emit(
        json_,
        {"callId": handle.call_id, "idempotencyKey": handle.idempotency_key},
        lambda: out.print(handle.call_id, markup=False),
    )


@calls_app.command("get")
def calls_get(call_id: str, json_: JsonOpt = False) -> None:
    """Where a call is, its attempts, and its outcome once done."""
    status = _run(json_, lambda tb: tb.runs.call_status(call_id))
    data: dict[str, Any] = {"callId": status.call_id, "state": status.state, "attempts": status.attempts}
    if status.result is not None:
        r = status.result
        data["outcome"] = (
            {"status": "ok", "output": r.output}
            if r.ok
            else {"status": "error", "error": r.error.to_wire() if r.error else None}
        )

    def human() -> None:
        out.print(f"{status.call_id}  {status.state}  attempts {status.attempts}", markup=False)
        if "outcome" in data:
            _print_json(data["outcome"])

    _emit(json_, data, human)


# ---- approvals, credentials, events, workflows -------------------------------------------------


@approvals_app.command("list")
def approvals_list(
    run: Annotated[str | None, typer.Option("--run")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace")] = None,
    json_: JsonOpt = False,
) -> None:
    """The approvals waiting for a decision."""
    pending = _run(json_, lambda tb: tb.approvals.list(run_id=run, namespace=namespace))

    def human() -> None:
        _print_table(
            f"{len(pending)} pending approval(s)",
            ("approval", "tool", "run", "namespace", "input"),
            (
                (a.approval_id, a.tool, a.run_id, a.namespace or "", shorten(json.dumps(a.input), 60))
                for a in pending
            ),
        )

    _emit(json_, {"approvals": pending}, human)


def _decide(approval_id: str, approve: bool, reason: str | None, json_: JsonOpt) -> None:
    decision = _run(json_, lambda tb: tb.approvals.decide(approval_id, approve, reason))
    _emit(
        json_,
        {"approvalId": approval_id, "decision": decision},
        lambda: out.print(f"{approval_id} {decision}"),
    )


@approvals_app.command("approve")
def approvals_approve(
    approval_id: str, reason: Annotated[str | None, typer.Option("--reason")] = None, json_: JsonOpt = False
) -> None:
    """Approve a pending call."""
    _decide(approval_id, True, reason, json_)


@approvals_app.command("deny")
def approvals_deny(
    approval_id: str, reason: Annotated[str | None, typer.Option("--reason")] = None, json_: JsonOpt = False
) -> None:
    """Deny a pending call (its outcome becomes denied with the reason)."""
    _decide(approval_id, False, reason, json_)


@tokens_app.command("create")
def tokens_create(
    namespace: Annotated[str, typer.Option("--namespace", help="The end user whose credentials calls use.")],
    toolset: Annotated[list[str], typer.Option("--toolset", help="A toolset id it may reach (repeat).")],
    ttl: Annotated[str | None, typer.Option("--ttl", help="How long it lives (default 720h).")] = None,
    label: Annotated[str | None, typer.Option("--label")] = None,
    json_: JsonOpt = False,
) -> None:
    """Issue a bearer token for the gateway (shown this once; only its hash is stored)."""
    issued = _run(json_, lambda tb: tb.tokens.create(namespace, list(toolset), ttl=ttl, label=label))
    _emit(
        json_,
        issued.wire(),
        lambda: out.print(
            f"{issued.token}\n{issued.info.id} for {namespace}, expires {issued.info.expires_at}"
        ),
    )


@tokens_app.command("list")
def tokens_list(
    namespace: Annotated[str | None, typer.Option("--namespace")] = None, json_: JsonOpt = False
) -> None:
    """Live tokens (never the tokens themselves)."""
    tokens = _run(json_, lambda tb: tb.tokens.list(namespace))

    def human() -> None:
        _print_table(
            f"{len(tokens)} token(s)",
            ("id", "namespace", "toolsets", "expires"),
            ((t.id, t.namespace, " ".join(t.toolsets), t.expires_at) for t in tokens),
        )

    _emit(json_, {"tokens": [t.wire() for t in tokens]}, human)


@tokens_app.command("revoke")
def tokens_revoke(token_id: str, json_: JsonOpt = False) -> None:
    """Revoke a token at once."""
    _run(json_, lambda tb: tb.tokens.revoke(token_id))
    _emit(json_, {"id": token_id, "revoked": True}, lambda: out.print(f"{token_id} revoked"))


@credentials_app.command("set")
def credentials_set(
    level: Annotated[str, typer.Option("--level", help="toolset, namespace or run")],
    toolset: Annotated[
        str | None, typer.Option("--toolset", help="toolset id (toolset, namespace levels)")
    ] = None,
    namespace: Annotated[str | None, typer.Option("--namespace")] = None,
    run: Annotated[str | None, typer.Option("--run")] = None,
    file: Annotated[
        str | None, typer.Option("-f", "--file", help="{servers: {...}} as JSON/YAML ('-': stdin)")
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option("--header", help="SERVER:NAME=VALUE, repeatable (prefer -f: shells keep history)"),
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """Replace the credentials of one level and scope; parked calls there are sent again."""
    credentials: dict[str, Any] = {"servers": {}}
    if file:
        loaded = _load(file, json_)
        if not isinstance(loaded, dict) or not isinstance(loaded.get("servers"), dict):
            _usage(
                json_,
                f"{file} must hold {{servers: {{NAME: {{headers: {{...}}}}}}}} ({{servers: {{}}}} clears)",
            )
        credentials = loaded
    for item in header or []:
        server, sep, rest = item.partition(":")
        name, eq, value = rest.partition("=")
        if not (sep and eq and server and name):
            _usage(json_, "--header takes SERVER:NAME=VALUE")
        credentials.setdefault("servers", {}).setdefault(server, {"headers": {}})["headers"][name] = value
    if not file and not header:
        _usage(json_, "give credentials with -f or --header")
    if level == "toolset":
        if not toolset:
            _usage(json_, "--level toolset needs --toolset")
        work = lambda tb: tb.toolsets.set_credentials(toolset, credentials)  # noqa: E731
    elif level == "namespace":
        if not (toolset and namespace):
            _usage(json_, "--level namespace needs --namespace and --toolset")
        work = lambda tb: tb.namespaces.set_credentials(namespace, toolset, credentials)  # noqa: E731
    elif level == "run":
        if not run:
            _usage(json_, "--level run needs --run")
        work = lambda tb: tb.runs.attach(run).set_credentials(credentials)  # noqa: E731
    else:
        _usage(json_, f"--level must be toolset, namespace or run, not {level!r}")
    got = _run(json_, work)
    _emit(json_, {"level": got}, lambda: out.print(f"credentials set at the {got} level (values not shown)"))


@credentials_app.command("connect")
def credentials_connect(
    server: Annotated[str, typer.Option("--server", help="the toolset's MCP server to connect")],
    toolset: Annotated[
        str | None, typer.Option("--toolset", help="toolset id (toolset, namespace levels)")
    ] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="the end user (namespace level)")
    ] = None,
    run: Annotated[str | None, typer.Option("--run", help="run id (run level)")] = None,
    scope: Annotated[list[str] | None, typer.Option("--scope", help="a scope to ask for, repeatable")] = None,
    client_id: Annotated[str | None, typer.Option("--client-id", help="a client registered by hand")] = None,
    client_secret_env: Annotated[
        str | None, typer.Option("--client-secret-env", help="name of the variable holding its secret")
    ] = None,
    client_credentials: Annotated[
        bool, typer.Option("--client-credentials", help="machine to machine (toolset level)")
    ] = False,
    wait: Annotated[
        float, typer.Option("--wait", help="seconds to wait for the user (0: do not wait)")
    ] = 600,
    json_: JsonOpt = False,
) -> None:
    """Connect a server's OAuth account at a level: prints the URL to open and waits until the
    end user has consented (tokens are kept and renewed by toolbus; none is shown)."""
    if run and (toolset or namespace):
        _usage(json_, "--run goes alone (the run names its toolset and end user)")
    if not run and not toolset:
        _usage(json_, "give --toolset (with --namespace for an end user) or --run")
    client: dict[str, str] | None = None
    if client_id:
        client = {"clientId": client_id}
        if client_secret_env:
            secret = os.environ.get(client_secret_env)
            if not secret:
                _usage(json_, f"${client_secret_env} is not set")
            client["clientSecret"] = secret
    target: dict[str, Any] = {"run_id": run} if run else {"toolset_id": toolset, "namespace": namespace}

    async def work(tb: Toolbus) -> dict[str, Any]:
        conn = await Connections(tb).connect(
            server,
            scopes=scope or None,
            client=client,
            grant="clientCredentials" if client_credentials else "authorizationCode",
            **target,
        )
        if conn.status == "connected":
            await conn.close()
            return {"connectionId": conn.id, "level": conn.level, "status": "connected"}
        if json_ or STATE.json:
            sys.stdout.write(
                json.dumps({"connectionId": conn.id, "authorizationUrl": conn.authorization_url}) + "\n"
            )
        else:
            out.print(f"Open this URL to connect '{server}' ({conn.level} level):", markup=False)
            out.print(conn.authorization_url or "", markup=False)
            if wait:
                out.print(f"waiting for the user (up to {wait:g}s) ...", markup=False)
        sys.stdout.flush()
        if not wait:
            await conn.close()
            return {"connectionId": conn.id, "level": conn.level, "status": "pending"}
        data = await conn.wait(wait)
        return {**data, "status": "connected"}

    got = _run(json_, work)
    _emit(
        json_,
        got,
        lambda: out.print(
            f"connected: {got.get('server', server)} at the {got['level']} level"
            + (f", scopes {' '.join(got['scopes'])}" if got.get("scopes") else "")
            + (f", token until {got['expiresAt']}" if got.get("expiresAt") else "")
            + " (tokens not shown)",
            markup=False,
        ),
    )


@credentials_app.command("status")
def credentials_status(
    toolset: Annotated[str | None, typer.Option("--toolset")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace")] = None,
    run: Annotated[str | None, typer.Option("--run")] = None,
    json_: JsonOpt = False,
) -> None:
    """The OAuth connections at a level: server, status, scopes, until when, last refresh."""
    target: dict[str, Any] = {"run_id": run} if run else {"toolset_id": toolset, "namespace": namespace}
    got = _run(json_, lambda tb: Connections(tb).status(**target))
    _emit(json_, got.model_dump(mode="json", by_alias=True))


@credentials_app.command("disconnect")
def credentials_disconnect(
    server: Annotated[str, typer.Option("--server")],
    toolset: Annotated[str | None, typer.Option("--toolset")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace")] = None,
    run: Annotated[str | None, typer.Option("--run")] = None,
    json_: JsonOpt = False,
) -> None:
    """Remove a server's OAuth connection at a level; its token is revoked where offered."""
    target: dict[str, Any] = {"run_id": run} if run else {"toolset_id": toolset, "namespace": namespace}
    got = _run(json_, lambda tb: Connections(tb).disconnect(server, **target))
    _emit(json_, got.model_dump(mode="json", by_alias=True))


@events_app.command("tail")
def events_tail(
    run: Annotated[str, typer.Option("--run", help="run id")],
    follow: Annotated[bool, typer.Option("--follow/--no-follow", help="wait for new events")] = True,
    json_: JsonOpt = False,
) -> None:
    """A run's call events from the first, one per line; follows new ones unless --no-follow."""
    as_json = json_ or STATE.json

    async def work(tb: Toolbus) -> int:
        count = 0
        async for event in tb.runs.attach(run).events(follow=follow):
            count += 1
            wire = _jsonable(event)
            if as_json:
                sys.stdout.write(json.dumps(wire) + "\n")
                sys.stdout.flush()
            else:
                extra = {k: v for k, v in wire.items() if k not in ("type", "callId", "runId", "at")}
                out.print(
                    f"{event.at}  {event.call_id}  {event.type:<18} {json.dumps(extra) if extra else ''}",
                    markup=False,
                )
        return count

    _run(json_, work)


@workflows_app.command("publish")
def workflows_publish(
    file: Annotated[
        str, typer.Option("-f", "--file", help="{name, description, inputSchema, outputSchema, definition}")
    ],
    json_: JsonOpt = False,
) -> None:
    """Publish a workflow version; prints name@version."""
    spec = _load(file, json_)
    if not isinstance(spec, dict) or "name" not in spec or "inputSchema" not in spec:
        _usage(json_, f"{file} must hold an object with name and inputSchema")
    version = _run(
        json_,
        lambda tb: tb.workflows.publish(
            spec["name"],
            input_schema=spec["inputSchema"],
            output_schema=spec.get("outputSchema"),
            description=spec.get("description", ""),
            definition=spec.get("definition"),
        ),
    )
    _emit(json_, {"name": spec["name"], "version": version}, lambda: out.print(f"{spec['name']}@{version}"))


@workflows_app.command("get")
def workflows_get(
    name: str, version: Annotated[str | None, typer.Option("--version")] = None, json_: JsonOpt = False
) -> None:
    """A published workflow (the latest version unless --version)."""
    workflow = _run(json_, lambda tb: tb.workflows.get(name, version))
    _emit(json_, workflow, lambda: _print_json(workflow))


# ---- the local stack ---------------------------------------------------------------------------


def _stack(*args: str) -> None:
    from toolbus_devstack.stack import main as stack_main

    raise typer.Exit(stack_main(list(args), prog="toolbus"))


@app.command("up")
def up(
    services: Annotated[str | None, typer.Option("--services", help="comma-separated subset")] = None,
    port_base: Annotated[
        int | None,
        typer.Option("--port-base", help="registry's HTTP port; the others follow (TOOLBUS_PORT_BASE)"),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--ready-timeout", help="seconds to wait for each /readyz")
    ] = 60.0,
    json_: JsonOpt = False,
) -> None:
    """Start NATS/Redis (if none answer) and the services on this machine, as `make up` does."""
    args = ["up", "--timeout", str(timeout)]
    if port_base is not None:
        args += ["--port-base", str(port_base)]
    if services:
        args += ["--services", services]
    if json_ or STATE.json:
        args.append("--json")
    _stack(*args)


@app.command("down")
def down(json_: JsonOpt = False) -> None:
    """Stop exactly what `toolbus up` / `make up` started."""
    _stack("down", *(["--json"] if json_ or STATE.json else []))


@app.command("status")
def status(json_: JsonOpt = False) -> None:
    """What `up` started and whether each service is ready."""
    _stack("status", *(["--json"] if json_ or STATE.json else []))


@app.command("logs")
def logs(
    follow: Annotated[bool, typer.Option("-f", "--follow")] = False,
    lines: Annotated[int, typer.Option("-n", "--lines")] = 50,
    json_: JsonOpt = False,
) -> None:
    """The stack's logs (`-f` to follow)."""
    _stack(
        "logs", "-n", str(lines), *(["-f"] if follow else []), *(["--json"] if json_ or STATE.json else [])
    )


def main() -> None:
    """Console-script entry point. With `--json` anywhere before a `--`, a usage error the
    argument parser finds (a missing argument, an unknown option or command) is one JSON document
    on stdout too, with exit code 2, as the commands' own usage errors are."""
    args = sys.argv[1:]
    if "--json" not in args[: args.index("--") if "--" in args else None]:
        app()
        return
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # the parser's errors; a usage error's exit code is 2
        status = int(getattr(exc, "exit_code", 1))
        error = {
            "code": "usage" if status == EXIT_CODES["usage"] else "error",
            "message": exc.format_message(),
        }
        sys.stdout.write(json.dumps({"ok": False, "error": error}) + "\n")
        sys.exit(status)
    except typer.Abort:
        err.print("Aborted.")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
