"""Every NATS subject toolbus uses, public and internal: the only place a subject string is built."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PREFIX = "toolbus"
PREFIX_PATTERN = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"
"""A subject prefix: dot-separated tokens of `[A-Za-z0-9_-]` (no spaces, wildcards or empty
tokens), so every subject built under it is one a NATS client can publish to."""


def check_prefix(prefix: str) -> str:
    """`prefix`, or ValueError saying what a prefix may be."""
    if not re.fullmatch(PREFIX_PATTERN, prefix):
        raise ValueError(
            f"subject prefix {prefix[:80]!r} is not dot-separated tokens of letters, digits, '_' and '-'"
        )
    return prefix


WORKER_QUEUE = "toolbus-workers"
"""The queue group host-tool workers subscribe in."""

JS_ACK_PREFIX = "$JS.ACK."
"""The reply subject of every message a JetStream consumer delivers."""

STORED_HEADERS = ("Nats-Stream", "Nats-Sequence")
"""Headers nats-server puts on a stored message it hands out by a direct get (to whatever reply
subject the request named), beside `Nats-Subject`. Not `Nats-Subject` alone: nats-server 2.10 and
later put that on the no-responders status too (`Status: 503`, the subject nobody serves), which
must still reach the host-result subscription."""


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether `subject` is one that a subscription to `pattern` (`*` one token, `>` the rest)
    is meant for."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(have) == len(want)


def consumer_delivery(
    subscribed: str, subject: str, reply: str | None, headers: Mapping[str, str] | None = None
) -> bool:
    """Whether a message on a core subscription to `subscribed` is a stored message JetStream
    handed out rather than one published there: a consumer's delivery (its reply is an ack
    subject, or it carries a stored subject that is not one of `subscribed`) or a direct get's
    answer (`STORED_HEADERS`). A user allowed to read a stream (a harness: the events and the
    outputs) can have them sent to any subject and queue group, whatever it may publish on
    (nats-server checks neither a consumer's deliver subject nor a request's reply subject
    against the user's permissions), and an output stored by reference is the tool's own bytes:
    such a message is never a request, a task or a result, and is dropped unread."""
    if (reply or "").startswith(JS_ACK_PREFIX) or not subject_matches(subscribed, subject):
        return True
    return headers is not None and any(name in headers for name in STORED_HEADERS)


@dataclass(frozen=True, slots=True)
class Subjects:
    """Subjects under one prefix (`TOOLBUS_SUBJECT_PREFIX`, `toolbus` by default)."""

    prefix: str = DEFAULT_PREFIX

    def _s(self, rest: str) -> str:
        return f"{self.prefix}.{rest}"

    # Registry
    @property
    def toolsets_create(self) -> str:
        return self._s("toolsets.create")

    @property
    def toolsets_get(self) -> str:
        return self._s("toolsets.get")

    @property
    def toolsets_declarations(self) -> str:
        return self._s("toolsets.declarations")

    @property
    def toolsets_search(self) -> str:
        return self._s("toolsets.search")

    @property
    def toolsets_namespaces(self) -> str:
        return self._s("toolsets.namespaces")

    @property
    def workflows_publish(self) -> str:
        return self._s("workflows.publish")

    @property
    def workflows_get(self) -> str:
        return self._s("workflows.get")

    def workflows_start(self, name: str) -> str:
        return self._s(f"workflows.start.{name}")

    # Dispatcher
    @property
    def runs_open(self) -> str:
        return self._s("runs.open")

    @property
    def runs_close(self) -> str:
        return self._s("runs.close")

    @property
    def calls_start(self) -> str:
        return self._s("calls.start")

    @property
    def calls_invoke(self) -> str:
        return self._s("calls.invoke")

    @property
    def calls_get(self) -> str:
        return self._s("calls.get")

    # Gateway
    @property
    def tokens_create(self) -> str:
        return self._s("tokens.create")

    @property
    def tokens_list(self) -> str:
        return self._s("tokens.list")

    @property
    def tokens_revoke(self) -> str:
        return self._s("tokens.revoke")

    # Events
    def call_events(self, run_id: str, call_id: str) -> str:
        return self._s(f"events.calls.{run_id}.{call_id}")

    def run_events(self, run_id: str) -> str:
        """Wildcard over every event of one run: what a harness replays."""
        return self._s(f"events.calls.{run_id}.*")

    @property
    def all_events(self) -> str:
        return self._s("events.>")

    @property
    def approvals_requested(self) -> str:
        return self._s("events.approvals.requested")

    @property
    def credentials_expired(self) -> str:
        return self._s("events.credentials.expired")

    # Approvals
    @property
    def approvals_list(self) -> str:
        return self._s("approvals.list")

    @property
    def approvals_decide(self) -> str:
        return self._s("approvals.decide")

    @property
    def approvals_history(self) -> str:
        return self._s("approvals.history")

    @property
    def approvals_remembered_list(self) -> str:
        return self._s("approvals.remembered.list")

    @property
    def approvals_remembered_revoke(self) -> str:
        return self._s("approvals.remembered.revoke")

    # Credentials
    @property
    def toolsets_credentials_set(self) -> str:
        return self._s("toolsets.credentials.set")

    @property
    def namespaces_credentials_set(self) -> str:
        return self._s("namespaces.credentials.set")

    @property
    def runs_credentials_set(self) -> str:
        return self._s("runs.credentials.set")

    @property
    def credentials_connect(self) -> str:
        """Start an OAuth connection for a server at a level (CredentialsConnectRequest)."""
        return self._s("credentials.connect")

    @property
    def credentials_status(self) -> str:
        return self._s("credentials.status")

    @property
    def credentials_disconnect(self) -> str:
        return self._s("credentials.disconnect")

    @property
    def credentials_connected(self) -> str:
        return self._s("events.credentials.connected")

    @property
    def credentials_failed(self) -> str:
        return self._s("events.credentials.failed")

    # Host tools
    def host_call(self, tool: str) -> str:
        return self._s(f"host.call.{tool}")

    def host_heartbeat(self, call_id: str, token: str | None = None) -> str:
        """A heartbeat's subject: with the attempt's token (as in its reply subject) it is the
        worker's for sure; the bare `host.heartbeat.<callId>` of the contract counts only with the
        running attempt in its body."""
        return self._s(f"host.heartbeat.{call_id}" if token is None else f"host.heartbeat.{call_id}.{token}")

    def host_result(self, call_id: str, token: str | None = None) -> str:
        """Where a host call's result goes: the task's reply subject, `host.result.<callId>.<token>`
        with the attempt's own token (nobody but the worker the task went to learns it), or the
        bare `host.result.<callId>` of the contract, for workers that publish there themselves."""
        return self._s(f"host.result.{call_id}" if token is None else f"host.result.{call_id}.{token}")

    def host_cancel(self, token: str) -> str:
        """Where the dispatcher tells the worker to stop an attempt it gave up: the attempt's token,
        as in its reply subject (no call id: every worker hears every cancel)."""
        return self._s(f"host.cancel.{token}")

    @property
    def host_cancels(self) -> str:
        return self._s("host.cancel.*")

    @property
    def host_heartbeats(self) -> str:
        return self._s("host.heartbeat.>")

    @property
    def host_results(self) -> str:
        return self._s("host.result.>")

    # Internal: service to service. Captured by the INTERNAL JetStream stream so that a command
    # sent while its consumer is down is delivered when it is back.
    @property
    def internal_all(self) -> str:
        return self._s("internal.>")

    @property
    def internal_approval_requests(self) -> str:
        """dispatcher -> approval: a call waits for a decision (ApprovalNeeded)."""
        return self._s("internal.approvals.needed")

    @property
    def internal_approval_decisions(self) -> str:
        """approval -> dispatcher: a decision to apply (ApprovalDecided)."""
        return self._s("internal.approvals.decided")

    @property
    def internal_calls_park(self) -> str:
        """dispatcher -> credentials: a call met a 401 and waits for new credentials (CallParked)."""
        return self._s("internal.credentials.park")

    @property
    def internal_calls_resume(self) -> str:
        """credentials -> dispatcher: parked calls to send again, in order (CallsResume)."""
        return self._s("internal.calls.resume")

    @property
    def internal_credentials_changed(self) -> str:
        """credentials -> every dispatcher: drop cached credentials of one scope (plain NATS)."""
        return self._s("credentials.changed")

    @property
    def internal_dead_letters(self) -> str:
        """Internal commands no consumer can apply, kept (in the INTERNAL stream) with why."""
        return self._s("internal.deadletter.>")

    @property
    def internal_runs_closed(self) -> str:
        """dispatcher -> approval, credentials: a run ended (RunClosed)."""
        return self._s("internal.runs.closed")
