"""Every Redis key toolbus writes, under one deployment prefix: the only place a key is spelled.

Services that share state (the dispatcher writes runs, the credentials service checks a run
exists) agree on layout by calling these, never by formatting keys themselves.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str

    # ---- dispatcher: runs and calls ---------------------------------------------------------
    def run(self, run_id: str) -> str:
        """Hash: toolsetId, namespace, state (`open`|`closed`), openedAt."""
        return f"{self.prefix}:run:{{{run_id}}}"

    def run_calls(self, run_id: str) -> str:
        """Set of the run's call ids."""
        return f"{self.prefix}:run:{{{run_id}}}:calls"

    def run_keys(self, run_id: str) -> str:
        """Hash idempotencyKey -> callId for one run."""
        return f"{self.prefix}:run:{{{run_id}}}:keys"

    def call(self, call_id: str) -> str:
        """Hash: the call's request, state, attempts and outcome."""
        return f"{self.prefix}:call:{call_id}"

    def call_replies(self, call_id: str) -> str:
        """List of `calls.invoke` reply subjects waiting for the call's outcome."""
        return f"{self.prefix}:replies:{call_id}"

    def run_waiting(self, run_id: str) -> str:
        """ZSET callId -> arrival sequence: calls in `waitingSlot`, first come first served."""
        return f"{self.prefix}:run:{{{run_id}}}:waiting"

    def run_slots(self, run_id: str) -> str:
        """ZSET callId -> lease expiry (unix s, Redis's clock): the run's slots held by running calls (max 16)."""
        return f"{self.prefix}:run:{{{run_id}}}:slots"

    def run_tool_slots(self, run_id: str, tool: str) -> str:
        """ZSET callId -> lease expiry (Redis's clock): slots of one tool with a `concurrency` policy in one run."""
        return f"{self.prefix}:run:{{{run_id}}}:tool:{tool}"

    @property
    def call_leases(self) -> str:
        """ZSET callId -> lease expiry (Redis's clock) of every running call; the dispatchers' reapers watch it."""
        return f"{self.prefix}:calls:leases"

    @property
    def call_events_outbox(self) -> str:
        """Stream of call events (and the commands written with them) stored with the state change
        they report, until the dispatcher's relay has them in JetStream (then deleted)."""
        return f"{self.prefix}:calls:outbox"

    @property
    def call_events_relay_lock(self) -> str:
        """String with a TTL: the token of the one dispatcher replica relaying the outbox."""
        return f"{self.prefix}:calls:outbox:relay"

    # ---- credentials --------------------------------------------------------------------------
    def credentials(self, level: str, scope: str) -> str:
        """Encrypted credentials document of one level and scope."""
        return f"{self.prefix}:cred:{level}:{scope}"

    def credentials_set_version(self, level: str, scope: str) -> str:
        """The credentials version counter's value after the last set at one level and scope."""
        return f"{self.prefix}:cred:{level}:{scope}:set-version"

    @property
    def credentials_version(self) -> str:
        """Counter bumped on every credentials change; read by the dispatcher to keep its cache."""
        return f"{self.prefix}:cred:version"

    @property
    def credentials_index(self) -> str:
        """Set of the keys of every encrypted record kept with no TTL (credentials documents, OAuth
        connections and client registrations; a key whose record was dropped leaves with it):
        what `CredentialStore.rotate` walks, so that no service needs
        `SCAN`, which would list every service's keys."""
        return f"{self.prefix}:cred:index"

    @property
    def credentials_index_expiring(self) -> str:
        """ZSET key -> expiry (ms) of the encrypted records with a TTL (pending OAuth flows and
        links): walked by `CredentialStore.rotate` beside `credentials_index`; expired members are
        trimmed as new ones come."""
        return f"{self.prefix}:cred:expiring-index"

    def oauth_connection(self, level: str, scope: str, server: str) -> str:
        """Encrypted OAuth connection of one server at one level and scope (tokens, client)."""
        return f"{self.prefix}:oauth:conn:{level}:{scope}:{server}"

    def oauth_servers(self, level: str, scope: str) -> str:
        """Set of the servers with an OAuth connection at one level and scope."""
        return f"{self.prefix}:oauth:servers:{level}:{scope}"

    def oauth_step_up(self, level: str, scope: str, server: str) -> str:
        """Set of the scopes servers asked for in `insufficient_scope` challenges to one
        connection's token (step-up): the next authorization asks for them too."""
        return f"{self.prefix}:oauth:step-up:{level}:{scope}:{server}"

    @property
    def oauth_due(self) -> str:
        """ZSET `level\0scope\0server` -> when (ms) its access token is to be renewed."""
        return f"{self.prefix}:oauth:due"

    def oauth_lock(self, level: str, scope: str, server: str) -> str:
        """String with a TTL: the one replica renewing this connection's tokens."""
        return f"{self.prefix}:oauth:lock:{level}:{scope}:{server}"

    def oauth_flow(self, state_digest: str) -> str:
        """Encrypted pending authorization (verifier, client), by the SHA-256 of its `state`; short TTL."""
        return f"{self.prefix}:oauth:flow:{state_digest}"

    def oauth_start(self, token_digest: str) -> str:
        """Encrypted authorization not yet begun, by the SHA-256 of its link's token; TTL."""
        return f"{self.prefix}:oauth:start:{token_digest}"

    def oauth_client(self, digest: str) -> str:
        """Encrypted dynamically registered client, by the digest of (issuer, redirect URI)."""
        return f"{self.prefix}:oauth:client:{digest}"

    def parked(self, level: str, scope: str) -> str:
        """ZSET call id -> park sequence: the calls parked at one level and scope, in park order."""
        return f"{self.prefix}:parked:{level}:{scope}"

    def parked_servers(self, level: str, scope: str) -> str:
        """Hash call id -> server, for the calls parked at one level and scope."""
        return f"{self.prefix}:parked:{level}:{scope}:servers"

    def parked_notified(self, level: str, scope: str) -> str:
        """Hash server -> `pending`|`sent`: `credentials.expired` state while calls are parked."""
        return f"{self.prefix}:parked:{level}:{scope}:notified"

    @property
    def parked_index(self) -> str:
        """ZSET call id -> park time (ms since epoch) over every scope: drives the park timeout."""
        return f"{self.prefix}:parked-index"

    @property
    def parked_where(self) -> str:
        """Hash call id -> JSON `{"level","scope","runId"}` of every parked call."""
        return f"{self.prefix}:parked-where"

    @property
    def parked_seq(self) -> str:
        """Counter giving each parked call its place in park order."""
        return f"{self.prefix}:parked-seq"

    def parked_by_run(self, run_id: str) -> str:
        """Set of the parked call ids of one run (whatever level they are parked at)."""
        return f"{self.prefix}:parked-run:{{{run_id}}}"

    @property
    def parked_notify_due(self) -> str:
        """ZSET notice JSON -> due time (ms): `credentials.expired` notices waiting to go out."""
        return f"{self.prefix}:parked-notify-due"

    @property
    def parked_outbox(self) -> str:
        """Stream (`toolbus_common.outbox`): `CallsResume` commands written with the unparking
        they follow, until the credentials service's relay has them in JetStream."""
        return f"{self.prefix}:parked:outbox"

    @property
    def parked_outbox_relay_lock(self) -> str:
        """String with a TTL: the token of the one credentials replica relaying the outbox."""
        return f"{self.prefix}:parked:outbox:relay"

    @property
    def parked_sweep_lock(self) -> str:
        """Lock so that one replica at a time ends calls parked too long."""
        return f"{self.prefix}:parked-sweep-lock"

    # ---- webhooks -----------------------------------------------------------------------------
    @property
    def webhooks_due(self) -> str:
        """ZSET webhook id -> next attempt time."""
        return f"{self.prefix}:webhooks:due"

    def webhook(self, webhook_id: str) -> str:
        """Hash of one pending delivery: type, body, attempt, createdAt."""
        return f"{self.prefix}:webhook:{webhook_id}"

    # ---- approvals ----------------------------------------------------------------------------
    # Every approval key carries the hash tag `{approvals}`, so the approval service's Lua scripts
    # (which touch one approval and the indexes together) also run on a Redis Cluster.
    def approval(self, approval_id: str) -> str:
        """Hash: `needed` (the ApprovalNeeded JSON), runId, namespace, state
        (`pending`|`approved`|`denied`|`cancelled`), reason, decidedAt."""
        return f"{self.prefix}:{{approvals}}:a:{approval_id}"

    @property
    def approvals_pending(self) -> str:
        """ZSET approval id -> requestedAt (epoch ms) of every pending approval."""
        return f"{self.prefix}:{{approvals}}:pending"

    def approvals_pending_run(self, run_id: str) -> str:
        """ZSET approval id -> requestedAt (epoch ms): the run's pending approvals."""
        return f"{self.prefix}:{{approvals}}:pending:run:{run_id}"

    def approvals_pending_namespace(self, namespace: str) -> str:
        """ZSET approval id -> requestedAt (epoch ms): the namespace's pending approvals."""
        return f"{self.prefix}:{{approvals}}:pending:ns:{namespace}"

    @property
    def approvals_expiry(self) -> str:
        """ZSET approval id -> expiry time (epoch ms), only when an approval timeout is set."""
        return f"{self.prefix}:{{approvals}}:expiry"

    @property
    def approvals_outbox(self) -> str:
        """Stream (`toolbus_common.outbox`): `approval.requested` events and decisions for the
        dispatcher, written with the change they follow, until the relay has them in JetStream."""
        return f"{self.prefix}:{{approvals}}:outbox:stream"

    @property
    def approvals_outbox_relay_lock(self) -> str:
        """String with a TTL: the token of the one approval replica relaying the outbox."""
        return f"{self.prefix}:{{approvals}}:outbox:relay"

    @property
    def approvals_legacy_queues(self) -> tuple[str, str]:
        """ZSETs approval id -> time queued of versions before the outbox: announcements not yet
        sent, decisions not yet acknowledged (read once at start, then deleted)."""
        return f"{self.prefix}:{{approvals}}:announce", f"{self.prefix}:{{approvals}}:outbox"

    @property
    def approvals_webhooks_due(self) -> str:
        """ZSET webhook id -> next attempt time: the approval service's webhook deliveries (under
        the tag, so the script that creates an approval stores its webhook too)."""
        return f"{self.prefix}:{{approvals}}:webhooks:due"

    def approvals_webhook(self, webhook_id: str) -> str:
        """Hash of one of the approval service's pending deliveries (as `webhook`)."""
        return f"{self.prefix}:{{approvals}}:webhook:{webhook_id}"

    @property
    def approvals_decided(self) -> str:
        """ZSET approval id -> decidedAt (epoch ms): decisions, for `approvals.history`."""
        return f"{self.prefix}:{{approvals}}:decided"

    def approvals_remembered(self, remembered_id: str) -> str:
        """Hash (with an expiry): a remembered decision (scope, decision, who, until when)."""
        return f"{self.prefix}:{{approvals}}:rem:{remembered_id}"

    def approvals_remembered_scope(self, namespace: str, tool: str, input_digest: str) -> str:
        """String (with an expiry): the remembered decision id of (namespace, tool, input digest or
        `*` for any input)."""
        return f"{self.prefix}:{{approvals}}:remscope:{namespace}\x00{tool}\x00{input_digest}"

    @property
    def approvals_remembered_index(self) -> str:
        """ZSET remembered decision id -> expiry (epoch ms), for listing."""
        return f"{self.prefix}:{{approvals}}:remembered"

    def approvals_console_login(self, state: str) -> str:
        """String (10 minutes): a console sign-in under way, by its OIDC `state` (PKCE verifier and
        nonce), used once."""
        return f"{self.prefix}:{{approvals}}:login:{state}"

    def approvals_closed_run(self, run_id: str) -> str:
        """Marker (with a TTL) that a run closed: an ApprovalNeeded arriving late is cancelled."""
        return f"{self.prefix}:{{approvals}}:closed:{run_id}"
