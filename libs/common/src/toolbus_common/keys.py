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

    # ---- credentials --------------------------------------------------------------------------
    def credentials(self, level: str, scope: str) -> str:
        """Encrypted credentials document of one level and scope."""
        return f"{self.prefix}:cred:{level}:{scope}"

    @property
    def credentials_version(self) -> str:
        """Counter bumped on every credentials change; read by the dispatcher to keep its cache."""
        return f"{self.prefix}:cred:version"

    # ---- webhooks -----------------------------------------------------------------------------
    @property
    def webhooks_due(self) -> str:
        """ZSET webhook id -> next attempt time."""
        return f"{self.prefix}:webhooks:due"

    def webhook(self, webhook_id: str) -> str:
        return f"{self.prefix}:webhook:{webhook_id}"
