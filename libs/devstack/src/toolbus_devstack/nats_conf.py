"""The NATS authorization of a toolbus deployment: the services in one account, each client role
(harness, worker, approver, workflow engine) in an account of its own, and in each account a user
allowed only its subjects.

`roles()` is the permission matrix as data; `render_auth_conf(prefix)` writes it as nats-server
configuration (`deploy/nats/toolbus-auth.conf` is its output for the default prefix, checked by
the tests); `dev_credentials()` makes random passwords for `make up` with `TOOLBUS_SECURE=1`.

Why accounts for the clients: nats-server checks a client's own publishes against its
permissions, but not where JetStream (or a service) sends the answer to a request: that goes to
whatever reply subject the requester named. In one account, a harness could have JetStream answer
a direct get of bytes it chose onto `internal.approvals.decided`, which the INTERNAL stream
stored and the dispatcher applied. A client account shares no subject with the services' account
but what is imported: its requests reach the services through service imports (the services'
answers return through the server's response mapping, to the requester's account only), the
events it may read come in as stream imports, and its only JetStream is the direct get of the
EVENTS stream and the outputs object store, imported the same way. Its own account has no
JetStream, so no consumer a client creates can deliver anywhere. The services share streams and
stay in one account, each user limited as before.

Each user's replies come to `_INBOX.<user>.>` (the client's `TOOLBUS_NATS_INBOX_PREFIX`) and it
may subscribe to nothing else under `_INBOX`: no user reads another's replies (the JetStream
fetches of the services, the toolsets they load, other harnesses' outcomes).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from toolbus_contracts import WORKER_QUEUE, Subjects

INBOX = "_INBOX"
RESPONSES = "_R_"
"""Where nats-server maps the reply subject of a request that came through a service import: a
service answering a client publishes there, and the server hands the answer back to the client."""
SERVICES_ACCOUNT = "TOOLBUS"
"""The account of the services; each client role has an account named after it (`account_of`)."""

RESPONSE_EXPIRES = "24h"
"""How long a received request's reply subject stays publishable (`allow_responses`): nats-server's
default is 2 minutes, shorter than a host-tool attempt (no limit but heartbeats) or a workflow
(`TOOLBUS_DISPATCHER_WORKFLOW_TIMEOUT`, default 1 h) may run."""


def js_name(prefix: str, name: str) -> str:
    """Same rule as `toolbus_common.settings.stream_name` (devstack does not import common)."""
    import re

    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', prefix)}_{name}"


def js_read(stream: str) -> list[str]:
    """JetStream API subjects to read a stream: info, message gets, consumers (create, info,
    delete, fetch) and their acks and flow control."""
    api = "$JS.API"
    # nats-py finds an object store's stream by subject (`STREAM.NAMES`) to read an object.
    names = [f"{api}.STREAM.NAMES"] if stream.startswith("OBJ_") else []
    return [
        *names,
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.DURABLE.CREATE.{stream}.>",
        f"{api}.CONSUMER.INFO.{stream}.>",
        f"{api}.CONSUMER.DELETE.{stream}.>",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.>",
        f"$JS.ACK.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def js_direct_get(stream: str) -> list[str]:
    """The one JetStream request a client role may send: a direct get of a stream's message (by
    sequence, or the next or last on a subject). Its answer goes back to the requester's account
    through the import, so no answer a client asks for can land in the services' account."""
    return [f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>"]


def js_create(stream: str) -> list[str]:
    """Create the stream when it is missing, and bring its configuration up to date."""
    return [f"$JS.API.STREAM.CREATE.{stream}", f"$JS.API.STREAM.UPDATE.{stream}"]


def js_own(stream: str) -> list[str]:
    """Everything but deleting the stream: read, create, update, purge, delete messages."""
    return [
        *js_read(stream),
        *js_create(stream),
        f"$JS.API.STREAM.PURGE.{stream}",
        f"$JS.API.STREAM.MSG.DELETE.{stream}",
    ]


@dataclass(frozen=True)
class Role:
    """One NATS user: what it may publish and subscribe to."""

    name: str
    purpose: str
    publish: list[str]
    subscribe: list[str]
    allow_responses: bool = False
    """Publish one reply to the reply subject of each message it received (for `RESPONSE_EXPIRES`),
    and nothing more there: `allow_responses: {max: 1}`."""
    service: bool = False
    serves: list[str] = field(default_factory=list)
    """A client role's subjects of requests the services send it (exported to the services'
    account as a service); the rest of its subscriptions are streams imported from there."""
    answers_on: list[str] = field(default_factory=list)
    """Where a client role's answers to the services' messages go, when those name a reply
    subject in the services' account rather than an inbox (imported from there)."""
    share_info: bool = False
    """A client role whose requests carry who sent them: its service imports `share: true`, so
    nats-server adds a `Nats-Request-Info` header (account, user) the client cannot forge."""

    @property
    def inbox(self) -> str:
        return f"{INBOX}.{self.name}"


def roles(prefix: str = "toolbus") -> list[Role]:
    """The permission matrix of a deployment under `prefix`."""
    s = Subjects(prefix)
    events = js_name(prefix, "EVENTS")
    internal = js_name(prefix, "INTERNAL")
    toolsets = f"OBJ_{js_name(prefix, 'toolsets')}"
    outputs = f"OBJ_{js_name(prefix, 'outputs')}"
    workflows = f"KV_{js_name(prefix, 'workflows')}"
    embeddings = f"KV_{js_name(prefix, 'embeddings')}"
    calls = [s.runs_open, s.runs_close, s.calls_start, s.calls_invoke, s.calls_get]
    registry_api = [
        s.toolsets_create,
        s.toolsets_get,
        s.toolsets_declarations,
        s.toolsets_search,
        s.toolsets_namespaces,
    ]
    credential_sets = [
        s.toolsets_credentials_set,
        s.namespaces_credentials_set,
        s.runs_credentials_set,
        s.credentials_connect,
        s.credentials_status,
        s.credentials_disconnect,
    ]
    out: list[Role] = [
        Role(
            "harness",
            "register toolsets, open runs, call tools, set credentials, read events and outputs",
            publish=[
                *registry_api,
                s.workflows_get,
                *calls,
                *credential_sets,
                *js_direct_get(events),
                *js_direct_get(outputs),
            ],
            subscribe=[
                s.run_events("*"),
                s.credentials_expired,
                s.credentials_connected,
                s.credentials_failed,
            ],
        ),
        Role(
            "worker",
            f"serve host tools in the queue group {WORKER_QUEUE}; heartbeats; one result per call "
            "it was sent (the call's reply subject)",
            # No `host.result.>` here: each host call comes with reply subject
            # `host.result.<callId>.<token>`, which allow_responses lets this connection publish once.
            publish=[s.host_heartbeats],
            subscribe=[f"{s.host_call('>')} {WORKER_QUEUE}", s.host_cancels],
            allow_responses=True,
            answers_on=[s.host_results],
        ),
        Role(
            "approver",
            "list pending approvals and decide them",
            publish=[
                s.approvals_list,
                s.approvals_decide,
                s.approvals_history,
                s.approvals_remembered_list,
                s.approvals_remembered_revoke,
            ],
            subscribe=[s.approvals_requested],
            share_info=True,
        ),
        Role(
            "workflow-engine",
            "serve workflows.start.>, publish workflows, call tools from a workflow",
            publish=[s.workflows_publish, s.workflows_get, *calls],
            subscribe=[s.workflows_start(">")],
            allow_responses=True,
            serves=[s.workflows_start(">")],
        ),
        Role(
            "registry",
            "toolsets and workflows: owns the toolsets object store, the workflows and the tool-embeddings buckets",
            publish=[
                f"{INBOX}.>",
                f"{RESPONSES}.>",
                "$JS.API.INFO",
                s.toolsets_credentials_set,
                *js_own(toolsets),
                f"$O.{js_name(prefix, 'toolsets')}.>",
                *js_own(workflows),
                f"$KV.{js_name(prefix, 'workflows')}.>",
                *js_own(embeddings),
                f"$KV.{js_name(prefix, 'embeddings')}.>",
            ],
            subscribe=[*registry_api, s.workflows_publish, s.workflows_get],
            service=True,
        ),
        Role(
            "dispatcher",
            "runs and calls: owns EVENTS, writes INTERNAL commands, sends host calls and workflows",
            publish=[
                f"{INBOX}.>",
                f"{RESPONSES}.>",
                "$JS.API.INFO",
                s.all_events,
                s.internal_approval_requests,
                s.internal_calls_park,
                s.internal_runs_closed,
                s.internal_dead_letters,
                s.host_call(">"),
                s.host_cancels,
                s.workflows_start(">"),
                *js_own(events),
                *js_own(internal),
                *js_read(toolsets),
                *js_create(toolsets),
                *js_own(outputs),
                f"$O.{js_name(prefix, 'outputs')}.>",
            ],
            subscribe=[*calls, s.host_heartbeats, s.host_results, s.internal_credentials_changed],
            service=True,
        ),
        Role(
            "approval",
            "approvals: announces requests, sends decisions to the dispatcher",
            publish=[
                f"{INBOX}.>",
                f"{RESPONSES}.>",
                "$JS.API.INFO",
                s.approvals_requested,
                s.internal_approval_decisions,
                s.internal_dead_letters,
                s.toolsets_declarations,  # the console shows a tool's declaration line
                # approval.requested is relayed with the EVENTS stream's ack: made if missing
                f"$JS.API.STREAM.INFO.{events}",
                *js_create(events),
                *js_own(internal),
                *js_read(toolsets),
                *js_create(toolsets),
            ],
            subscribe=[
                s.approvals_list,
                s.approvals_decide,
                s.approvals_history,
                s.approvals_remembered_list,
                s.approvals_remembered_revoke,
                # the console's live updates: new approvals, and calls' approved/denied events
                s.approvals_requested,
                s.run_events("*"),
            ],
            service=True,
        ),
        Role(
            "credentials",
            "credential levels: resumes parked calls, tells dispatchers to drop cached credentials",
            publish=[
                f"{INBOX}.>",
                f"{RESPONSES}.>",
                "$JS.API.INFO",
                s.internal_calls_resume,
                s.internal_credentials_changed,
                s.internal_dead_letters,
                s.credentials_expired,
                s.credentials_connected,
                s.credentials_failed,
                *js_own(internal),
                *js_read(toolsets),
                *js_create(toolsets),
            ],
            subscribe=[*credential_sets],
            service=True,
        ),
        Role(
            "token-issuer",
            "issue, list and revoke the gateway's bearer tokens (tokens.*)",
            publish=[s.tokens_create, s.tokens_list, s.tokens_revoke],
            subscribe=[],
        ),
        Role(
            "gateway",
            "MCP endpoint: opens runs and calls tools for MCP clients, searches toolsets and reads their "
            "namespaces and declarations, reads "
            "toolsets and stored outputs; serves tokens.*",
            publish=[
                f"{INBOX}.>",
                "$JS.API.INFO",
                *calls,
                s.toolsets_search,
                s.toolsets_declarations,
                s.toolsets_namespaces,
                *js_read(toolsets),
                *js_create(toolsets),
                *js_read(outputs),
            ],
            subscribe=[s.tokens_create, s.tokens_list, s.tokens_revoke],
            service=True,
        ),
    ]
    return out


def role(name: str, prefix: str = "toolbus") -> Role:
    for r in roles(prefix):
        if r.name == name:
            return r
    raise KeyError(name)


def password_variable(name: str) -> str:
    """The environment variable nats-server reads this user's password (or bcrypt hash) from."""
    return "TOOLBUS_NATS_PASSWORD_" + name.upper().replace("-", "_")


def _list(items: Iterable[str], indent: str) -> str:
    items = list(dict.fromkeys(items))
    return "[\n" + "".join(f'{indent}  "{item}"\n' for item in items) + f"{indent}]"


def roles_of(prefixes: Sequence[str]) -> list[Role]:
    """The permission matrix of several deployments on one server (one subject prefix each): each
    role's user may do, under every prefix, what `roles(prefix)` allows it there, and no more."""
    if not prefixes:
        raise ValueError("at least one subject prefix")
    per_prefix = [roles(p) for p in prefixes]
    merged: list[Role] = []
    for i, first in enumerate(per_prefix[0]):
        same = [matrix[i] for matrix in per_prefix]
        merged.append(
            Role(
                first.name,
                first.purpose,
                publish=list(dict.fromkeys(s for r in same for s in r.publish)),
                subscribe=list(dict.fromkeys(s for r in same for s in r.subscribe)),
                allow_responses=first.allow_responses,
                service=first.service,
                serves=list(dict.fromkeys(s for r in same for s in r.serves)),
                answers_on=list(dict.fromkeys(s for r in same for s in r.answers_on)),
                share_info=first.share_info,
            )
        )
    return merged


def account_of(role: Role) -> str:
    """The account a role's user is in: the services share `SERVICES_ACCOUNT`, each client role
    has its own (so that one client role's imports are no other's)."""
    return SERVICES_ACCOUNT if role.service else role.name.upper().replace("-", "_")


def _subject(permission: str) -> str:
    """A subscribe permission's subject without its queue group (`subject queue`)."""
    return permission.split(" ", 1)[0]


def client_imports(role: Role) -> tuple[list[str], list[str]]:
    """(services, streams) a client role imports from the services' account: what it publishes
    and answers on are requests to the services; what it subscribes to, but serves, comes in as
    a stream."""
    services = [*role.publish, *role.answers_on]
    streams = [_subject(sub) for sub in role.subscribe if _subject(sub) not in role.serves]
    return list(dict.fromkeys(services)), list(dict.fromkeys(streams))


def _export(kind: str, subject: str, accounts: list[str]) -> str:
    threshold = f', response_threshold: "{RESPONSE_EXPIRES}"' if kind == "service" else ""
    return f'{{ {kind}: "{subject}", accounts: [{", ".join(accounts)}]{threshold} }}'


def _import(kind: str, account: str, subject: str, *, share: bool = False) -> str:
    shared = ", share: true" if share else ""
    return f'{{ {kind}: {{ account: {account}, subject: "{subject}" }}{shared} }}'


def _block(name: str, items: list[str], indent: str) -> list[str]:
    if not items:
        return []
    return [f"{indent}{name}: [", *(f"{indent}  {item}" for item in items), f"{indent}]"]


def render_auth_conf(prefix: str | Sequence[str] = "toolbus", *, nkeys: dict[str, str] | None = None) -> str:
    """nats-server configuration text: an `accounts` block with the services' account and one
    account per client role (imports and exports between them), a user per role. Passwords are
    read from environment variables (`$TOOLBUS_NATS_PASSWORD_<ROLE>`); a bcrypt hash (`nats
    server passwd`) works in their place. With `nkeys` (role -> public key `U...`), each role is
    an nkey user instead (no password anywhere: clients sign with their seed).

    `prefix` may be several prefixes (`roles_of`): one server for several deployments, e.g. the
    e2e tests' modules, each on a prefix of its own, against one secured server."""
    prefixes = [prefix] if isinstance(prefix, str) else list(prefix)
    matrix = roles_of(prefixes)
    shown = prefix if isinstance(prefix, str) else prefixes
    scope = (
        f"the subject prefix `{prefix}`" if isinstance(prefix, str) else "the prefixes " + ", ".join(prefixes)
    )
    lines = [
        "# Generated by toolbus_devstack.nats_conf.render_auth_conf("
        + repr(shown)
        + "): edit that, not this file.",
        f"# The services in the account {SERVICES_ACCOUNT}, each client role in an account of its own, for",
        f"# {scope}. Passwords come from the environment of nats-server (a plain",
        "# password or a bcrypt hash); see deploy/nats/README.md.",
        "",
    ]
    for r in matrix:
        var = r.name.upper().replace("-", "_") + "_PERMISSIONS"
        lines.append(f"# {r.name}: {r.purpose}")
        lines.append(f"{var} = {{")
        # A service answers clients' requests through their imports: on `_R_.…` subjects.
        publish = [*r.publish, f"{RESPONSES}.>"] if r.service else r.publish
        lines.append(f"  publish: {{ allow: {_list(publish, '  ')} }}")
        lines.append(f"  subscribe: {{ allow: {_list([*r.subscribe, f'{r.inbox}.>'], '  ')} }}")
        if r.allow_responses:
            lines.append(f'  allow_responses: {{ max: 1, expires: "{RESPONSE_EXPIRES}" }}')
        lines.append("}")
        lines.append("")

    def user(r: Role) -> str:
        var = r.name.upper().replace("-", "_") + "_PERMISSIONS"
        if nkeys is not None:
            return f'{{ nkey: "{nkeys[r.name]}", permissions: ${var} }}'
        return f'{{ user: "{r.name}", password: ${password_variable(r.name)}, permissions: ${var} }}'

    clients = [r for r in matrix if not r.service]
    exported: dict[tuple[str, str], list[str]] = {}
    for r in clients:
        services, streams = client_imports(r)
        for subject in services:
            exported.setdefault(("service", subject), []).append(account_of(r))
        for subject in streams:
            exported.setdefault(("stream", subject), []).append(account_of(r))
    lines.append("accounts {")
    lines.append(f"  {SERVICES_ACCOUNT}: {{")
    lines.append("    jetstream: enabled")
    lines.extend(_block("users", [user(r) for r in matrix if r.service], "    "))
    lines.extend(_block("exports", [_export(k, s, a) for (k, s), a in exported.items()], "    "))
    served = [_import("service", account_of(r), subject) for r in clients for subject in r.serves]
    lines.extend(_block("imports", served, "    "))
    lines.append("  }")
    for r in clients:
        account = account_of(r)
        services, streams = client_imports(r)
        lines.append(f"  {account}: {{")
        lines.extend(_block("users", [user(r)], "    "))
        imports = [_import("service", SERVICES_ACCOUNT, subject, share=r.share_info) for subject in services]
        imports += [_import("stream", SERVICES_ACCOUNT, subject) for subject in streams]
        lines.extend(_block("imports", imports, "    "))
        lines.extend(_block("exports", [_export("service", x, [SERVICES_ACCOUNT]) for x in r.serves], "    "))
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def dev_credentials() -> dict[str, str]:
    """A fresh random password per role (for a development stack, never reused)."""
    # nats-server parses an environment variable as a config value: a letter then hex stays a string.
    return {r.name: "p" + secrets.token_hex(24) for r in roles()}


def dev_nkeys() -> dict[str, tuple[str, str]]:
    """A fresh nkey user per role: role -> (seed `SU...`, public key `U...`)."""
    import nkeys  # type: ignore[import-untyped]

    out: dict[str, tuple[str, str]] = {}
    for r in roles():
        seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
        out[r.name] = (seed.decode(), nkeys.from_seed(bytearray(seed)).public_key.decode())
    return out


def server_env(passwords: dict[str, str]) -> dict[str, str]:
    """nats-server's environment for `render_auth_conf`'s password variables."""
    return {password_variable(name): value for name, value in passwords.items()}


def client_env(name: str, password: str) -> dict[str, str]:
    """`TOOLBUS_NATS_*` settings of a client connecting as `name`."""
    return {
        "TOOLBUS_NATS_USER": name,
        "TOOLBUS_NATS_PASSWORD": password,
        "TOOLBUS_NATS_INBOX_PREFIX": f"{INBOX}.{name}",
    }
