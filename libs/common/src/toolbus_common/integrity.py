"""Refusing a stored copy that does not match its content address.

Toolsets and workflow versions are content-addressed: their id is a hash of their canonical
content. A copy read from the store is checked against the id it was read under; one that fails
(someone with write access to the store replaced it) is refused with `StoredCopyAltered` and a
warning naming the id (never the content), and never served or cached.
"""

from __future__ import annotations

import logging

from toolbus_contracts.errors import NotFound

log = logging.getLogger(__name__)


class StoredCopyAltered(NotFound):
    """`notFound`: the store holds something under this id, but not what the id addresses. Not
    retryable: the genuine content is not there to serve until an operator deletes the altered
    copy and the content is stored again."""


def altered(kind: str, ident: str, *, field: str) -> StoredCopyAltered:
    """Log the failed check (a warning naming the id) and return the error to raise for it."""
    log.warning(f"stored {kind} failed its content check; refused", extra={kind + "Id": ident})
    return StoredCopyAltered(
        f"The stored copy of {kind} '{ident}' does not match its content address (it was altered "
        f"in the store) and is not served; an operator must delete it and store it again.",
        details={"field": field, "reason": "storedCopyAltered"},
    )
