"""`Toolbus`: the request core (`Core`) with the parts of the protocol on it."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from nats.aio.client import Client as NatsClient
from toolbus_contracts import CredentialsExpired

from toolbus._approvals import Approvals
from toolbus._connection import ConnectOptions
from toolbus._core import DEFAULT_BACKOFF, DEFAULT_TIMEOUT, Core, open_nats
from toolbus._feeds import Feed
from toolbus._retry import Backoff
from toolbus._runs import Runs
from toolbus._tokens import Tokens
from toolbus._toolsets import Namespaces, Toolsets, Workflows


class Toolbus(Core):
    """A connection to one toolbus deployment (a NATS server and a subject prefix).

        async with await Toolbus.connect() as tb:
            toolset = await tb.toolsets.create(mcp=[{"name": "github", "url": "..."}])
            async with await tb.runs.open(toolset) as run:
                print(await run.call("github.list_issues", {"repo": "x/y"}))

    `toolsets`, `runs`, `approvals`, `namespaces` and `workflows` hold the calls of each part of the
    protocol. Every failure is a `ToolbusError` subclass named after its contract code.

    With `retry_unavailable` (the default) every request of these parts that is answered a
    retryable `Unavailable` (a backing store down, or no service subscribed yet) is sent again,
    `backoff` apart, until its timeout is spent, then the last `Unavailable` is raised; each is
    safe to send again (README, "Retries").
    """

    def __init__(
        self,
        nc: NatsClient,
        prefix: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        owns_connection: bool = True,
        retry_unavailable: bool = True,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        super().__init__(
            nc,
            prefix,
            timeout=timeout,
            owns_connection=owns_connection,
            retry_unavailable=retry_unavailable,
            backoff=backoff,
        )
        self.toolsets = Toolsets(self)
        self.namespaces = Namespaces(self)
        self.workflows = Workflows(self)
        self.runs = Runs(self)
        self.approvals = Approvals(self)
        self.tokens = Tokens(self)
        """The gateway's bearer tokens (`tokens.*`)."""

    @classmethod
    async def connect(
        cls,
        nats_url: str | None = None,
        prefix: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry_unavailable: bool = True,
        backoff: Backoff = DEFAULT_BACKOFF,
        options: ConnectOptions | None = None,
        **connect_options: Any,
    ) -> Toolbus:
        """Connect to the deployment at `nats_url` under `prefix`.

        Unset arguments come from the environment, as the services read it (`TOOLBUS_NATS_URL`,
        `TOOLBUS_SUBJECT_PREFIX`, `TOOLBUS_NATS_USER`/`_PASSWORD`, `_TOKEN`, `_CREDS_FILE`,
        `_NKEY_FILE`, `_TLS_CA_FILE`, `_TLS_CERT_FILE`/`_TLS_KEY_FILE`, `_TLS_SERVER_NAME`,
        `_INBOX_PREFIX`), then the defaults (`nats://127.0.0.1:4222`, `toolbus`).
        `connect_options` are those settings by name (`creds_file=`, `token=`, `tls_ca_file=`, ...)
        and `name=`, `connect_timeout=`. A server that cannot be reached is `Unavailable` (the
        connect itself is not retried). `retry_unavailable=False` turns request retries off;
        `backoff` sets their waits (default 0.1 s doubling to 2 s, jittered).
        """
        opts = options or ConnectOptions.from_env(nats_url=nats_url, prefix=prefix, **connect_options)
        nc = await open_nats(opts)
        return cls(nc, opts.prefix, timeout=timeout, retry_unavailable=retry_unavailable, backoff=backoff)

    async def __aenter__(self) -> Toolbus:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def credentials_expired(
        self, *, toolset_id: str | None = None, run_id: str | None = None, namespace: str | None = None
    ) -> Feed[CredentialsExpired]:
        """`credentials.expired` notices from now on (of one toolset, run or end user where given):
        calls parked on a 401 at a level and scope, waiting for credentials set there again. A set
        made after it, or already on the call's `parked` event, resumes them."""

        def keep(event: CredentialsExpired) -> bool:
            data = event.data
            return (
                (toolset_id is None or data.toolset_id == toolset_id)
                and (run_id is None or data.run_id == run_id or (data.run_id is None and data.level != "run"))
                and (namespace is None or data.namespace in (namespace, None))
            )

        return await Feed.open(self, self.subjects.credentials_expired, CredentialsExpired, keep)
