"""Internal commands' signatures through a rolling rotation of `TOOLBUS_SECRET_KEY`: services on
`old`, on `new,old` and on `new` each verify what the others of the step before or after sign."""

from __future__ import annotations

import itertools

from cryptography.fernet import Fernet
from pydantic import SecretStr
from toolbus_common.signing import CommandSigner


def _signer(value: str) -> CommandSigner:
    return CommandSigner(SecretStr(value))


def test_every_step_of_a_rolling_rotation_verifies_its_neighbours() -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    steps = [_signer(old), _signer(f"{new},{old}"), _signer(new)]
    body = b'{"callIds":["call_1"]}'
    for a, b in itertools.pairwise(steps):
        for sender, receiver in ((a, b), (b, a)):
            assert receiver.verify(
                "p.internal.calls.resume", body, sender.sign("p.internal.calls.resume", body)
            )
    # Before and after the rotation nothing is shared: the old key's signature is refused.
    assert not steps[2].verify("s", body, steps[0].sign("s", body))
    # Bound to subject and body; a one-key signature is what it always was (one HMAC in hex).
    signature = steps[0].sign("s", body)
    assert len(signature) == 64 and not steps[0].verify("t", body, signature)
    assert not steps[0].verify("s", body + b" ", signature) and not steps[0].verify("s", body, None)
