"""Who decided: the NATS user a decision came in as, when the server vouches for it, else the
client's own word, marked as such.

With the accounts configuration (`toolbus_devstack.nats_conf`), the approver's import of
`approvals.*` shares the requester's info: nats-server puts a `Nats-Request-Info` header on the
request, with the requester's account and user, replacing any header of that name the client
sent. Without it (one open account) any client could write that header, so it is read only when
`TOOLBUS_APPROVAL_TRUST_REQUEST_INFO` says the deployment runs the accounts configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import orjson

REQUEST_INFO = "Nats-Request-Info"
ANONYMOUS = "anonymous"


@dataclass(frozen=True, slots=True)
class Identity:
    """Names deciders: `nats:<account>/<user>` (vouched for by the server), `claimed:<decider>`
    (the request's `decider` field, the client's word) or `anonymous`."""

    trust_request_info: bool = False

    def decider(self, headers: Mapping[str, str], claimed: str | None) -> str:
        if self.trust_request_info:
            vouched = _from_request_info(headers.get(REQUEST_INFO))
            if vouched is not None:
                return vouched
        if claimed:
            return f"claimed:{claimed}"
        return ANONYMOUS


def _from_request_info(raw: str | None) -> str | None:
    if not raw:
        return None
    try:
        info = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(info, dict):
        return None
    user, account = info.get("user"), info.get("acc")
    if not isinstance(user, str) or not user:
        return None
    return f"nats:{account}/{user}" if isinstance(account, str) and account else f"nats:{user}"
