"""Call outcomes as the SDK hands them out: the output (fetched from the object store when the
outcome carries `outputRef`), or the exception of the error code."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from nats.js import JetStreamContext

from toolbus._errors import Internal, ToolbusError, Unavailable, closed_as_unavailable, error_from_wire
from toolbus._stored import StoredObjectCorrupt, StoredObjectMissing, read_object


@dataclass(frozen=True)
class CallResult:
    """A finished call: `output` when `ok`, else `error` (the exception of its code)."""

    call_id: str
    idempotency_key: str | None
    ok: bool
    output: Any = None
    error: ToolbusError | None = None

    def unwrap(self) -> Any:
        """The output, or raise the call's error."""
        if self.error is not None:
            raise self.error
        return self.output


def _digest_matches(data: bytes, expected: str) -> bool:
    """`sha256` is lowercase hex (the contract); NATS's own `SHA-256=<base64url>` form is read too."""
    digest = hashlib.sha256(data).digest()
    if expected.upper().startswith("SHA-256="):
        return base64.urlsafe_b64encode(digest).decode().rstrip("=") == expected[8:].rstrip("=")
    return digest.hex() == expected.lower()


async def fetch_output_ref(js: JetStreamContext, ref: dict[str, Any], *, call_id: str) -> Any:
    """Read an output stored by reference (`{"bucket", "name", "size", "sha256"}`): the object's
    bytes are the output's JSON. A missing object is `Unavailable`; one whose size or digest do not
    match is `Internal` (never handed out)."""
    try:
        bucket, name = str(ref["bucket"]), str(ref["name"])
    except (KeyError, TypeError):
        raise Internal(f"Call {call_id}: outputRef lacks bucket or name.") from None
    details = {"callId": call_id, "bucket": bucket, "name": name}
    try:
        with closed_as_unavailable(f"$O.{bucket}"):
            data = await read_object(js, bucket, name)
    except StoredObjectMissing:
        raise Unavailable(
            f"Call {call_id}: the stored output {bucket}/{name} is not in the object store.", details=details
        ) from None
    except StoredObjectCorrupt:
        data = None
    size, sha = ref.get("size"), ref.get("sha256")
    if (
        data is None
        or (isinstance(size, int) and size != len(data))
        or (isinstance(sha, str) and not _digest_matches(data, sha))
    ):
        raise Internal(
            f"Call {call_id}: the stored output {bucket}/{name} does not match its size or sha256.",
            details=details,
        )
    return orjson.loads(data)


async def resolve(
    js: JetStreamContext, outcome: dict[str, Any], *, call_id: str, idempotency_key: str | None
) -> CallResult:
    """A wire outcome as a `CallResult` (its output fetched where it is stored by reference)."""
    if outcome.get("status") == "ok":
        if "outputRef" in outcome and "output" not in outcome:
            output = await fetch_output_ref(js, outcome["outputRef"], call_id=call_id)
        else:
            output = outcome.get("output")
        return CallResult(call_id, idempotency_key, True, output=output)
    error = error_from_wire(outcome.get("error"), callId=call_id)
    return CallResult(call_id, idempotency_key, False, error=error)
